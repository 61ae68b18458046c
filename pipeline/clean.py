"""List, and with --yes remove, what training leaves behind outside DVC's outputs.

    python -m pipeline.clean            # what there is, its size, and whether it may go
    python -m pipeline.clean --yes      # remove what may go

Two kinds of folders grow with every run and are never removed by the pipeline itself:
- `<paths.train_dir>.replaced/<time>/`: a finished run that a new experiment moved aside
  (`dvc exp run -S ...`, `train.resume=false`), once per distinct run, listed with its step and
  why it moved; DVC's cache holds what `dvc exp apply` needs. Removable.
  `<paths.train_dir>.preempted/` (a stopped run the next `dvc exp run` resumes) is kept.
- sweep trials' work folders (`<work-dir>/<study>-<key>/<point>/`, the key a hash of the
  study's storage and id; checkpoints, averaged model): removable once the point is finished
  and recorded (its `run.json` is in the study's results, `<results-dir>/<study>/trials/<point>/`),
  which the study never trains again, and only where the folder's `.study.json` names this
  clone's study (its SQLite storage under `--results-dir`, or `--storage`). A point without a
  record (running, interrupted, failed) resumes from its folder: kept, and so is the study's
  prepared data (`<work-dir>/<study>-<key>/data/`). Another clone's study, a folder without
  `.study.json` (another tool's, or made before study folders named their study) and a link are
  named and kept; a link's target is counted where it is, once.
- staging folders of a stage killed while it wrote its output folder (`.eval.tmp-<pid>-*`
  beside `paths.eval_dir`, also `paths.prepared` and `paths.tokenized`): as large as the
  output. Removable once no live process owns them; the stage's next run removes them too.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.cli import main, parser
from pipeline.disk_usage import folder_size, human_size

STUDY_DATA = "data"  # <work-dir>/<study>-<key>/data: prepared once per study (pipeline.sweep)


@dataclass
class Leftover:
    path: Path
    size: int
    removable: bool
    why: str


def train_leftovers(train_dir: Path) -> list[Leftover]:
    """The runs moved aside beside `train_dir`, and a stopped run waiting there."""
    from pipeline.training.resume import PREEMPTED_SUFFIX, REPLACED_SUFFIX, replaced_record

    found = []
    replaced = train_dir.with_name(train_dir.name + REPLACED_SUFFIX)
    if replaced.is_dir():
        for run in sorted(p for p in replaced.iterdir() if p.is_dir()):
            record = replaced_record(run) or {}
            step = f" at step {record['step']}" if record.get("step") is not None else ""
            why = f" ({record['why']})" if record.get("why") else ""
            found.append(Leftover(run, folder_size(run), True,
                                  f"a run{step} replaced by a newer one{why}"))  # fmt: skip
    preempted = train_dir.with_name(train_dir.name + PREEMPTED_SUFFIX)
    if preempted.is_dir():
        found.append(Leftover(preempted, folder_size(preempted), False,
                              "a stopped run that the next `dvc exp run` resumes"))  # fmt: skip
    return found


# The outputs a stage replaces whole (`pipeline.atomic.atomic_directory`), as paths.* names them.
SWAPPED_OUTPUTS = ("prepared", "tokenized", "eval_dir")


def staging_leftovers(paths) -> list[Leftover]:
    """The staging folders that a killed stage left beside the outputs it swaps in whole."""
    from pipeline.atomic import stale_staging

    return [
        Leftover(
            folder,
            folder_size(folder),
            True,
            f"left by a killed run writing {getattr(paths, name)}",
        )  # fmt: skip
        for name in SWAPPED_OUTPUTS
        for folder in stale_staging(getattr(paths, name))
    ]


def recorded_study(folder: Path) -> dict | None:
    """What a study's work folder's `.study.json` says (its study, storage and id), or None
    where it has none (another tool's folder, or one made before study folders named their
    study)."""
    import json

    from pipeline.sweep.work_dirs import STUDY_FILE

    try:
        identity = json.loads((folder / STUDY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) and "study" in identity else None


def _same_storage(url: str, other: str) -> bool:
    """Two storage URLs name one storage (an SQLite file compared by its resolved path)."""
    sqlite = "sqlite:///"
    if url.startswith(sqlite) and other.startswith(sqlite):
        return Path(url[len(sqlite) :]).resolve() == Path(other[len(sqlite) :]).resolve()
    return url == other


def clone_storage(study: str, results_root: Path, storage: str | None) -> str:
    """The storage this clone's study `study` is in: `storage` where given, else the SQLite
    file the sweep keeps under the results folder (`pipeline.sweep.storage.default_storage`)."""
    from pipeline.redaction import hide_password
    from pipeline.sweep.spec import STUDY_DB

    if storage is not None:
        return hide_password(storage)
    return f"sqlite:///{(results_root / study / STUDY_DB).resolve()}"


def _link(path: Path) -> Leftover:
    return Leftover(path, 0, False, f"a link to {os.readlink(path)} (counted where it points)")


def trial_leftovers(
    work_root: Path, results_root: Path, storage: str | None = None
) -> list[Leftover]:
    """Every study's point folders in `work_root`, removable where the point is recorded and
    the folder is this clone's study's; anything else there named and kept."""
    from pipeline.sweep.records import RUN_FILE

    found = []
    if not work_root.is_dir():
        return found
    for study in sorted(p for p in work_root.iterdir() if p.is_dir()):
        if study.is_symlink():
            found.append(_link(study))
            continue
        identity = recorded_study(study)
        if identity is None:
            why = "not a sweep study's work folder (no .study.json): whose it is is unknown"
            found.append(Leftover(study, folder_size(study), False, why))
            continue
        name, theirs = identity["study"], str(identity.get("storage"))
        mine = clone_storage(name, results_root, storage)
        if not _same_storage(theirs, mine):
            found.append(Leftover(study, folder_size(study), False, f"study '{name}' in "
                                  f"{theirs}, not this clone's ({mine})"))  # fmt: skip
            continue
        for point in sorted(p for p in study.iterdir() if p.is_dir()):
            if point.is_symlink():
                found.append(_link(point))
                continue
            size = folder_size(point)
            if point.name == STUDY_DATA:
                found.append(Leftover(point, size, False, "the study's prepared data"))
                continue
            record = results_root / name / "trials" / point.name / RUN_FILE
            if record.is_file():
                found.append(Leftover(point, size, True, f"finished, recorded in {record.parent}"))
            else:
                found.append(Leftover(point, size, False, "not recorded in "
                                      f"{results_root / name} (running, interrupted or "
                                      "failed: it resumes from here)"))  # fmt: skip
    return found


def parse_args(argv: list[str] | None):
    from pipeline.sweep.spec import RESULTS_ROOT, WORK_ROOT

    cli = parser("pipeline.clean", __doc__)
    cli.add_argument("--params", type=Path, default=Path("params.yaml"),
                     help="where paths.train_dir is read (default: params.yaml)")  # fmt: skip
    cli.add_argument("--results-dir", type=Path, default=RESULTS_ROOT,
                     help=f"the studies' records (default: {RESULTS_ROOT})")  # fmt: skip
    cli.add_argument("--work-dir", type=Path, default=WORK_ROOT,
                     help=f"the sweep trials' work folders (default: {WORK_ROOT})")  # fmt: skip
    cli.add_argument("--storage", help="the studies' storage, where the sweep was given one "
                     "(default: each study's SQLite file under --results-dir)")  # fmt: skip
    cli.add_argument("--yes", action="store_true", help="remove what is listed as removable")
    return cli.parse_args(argv)


def clean(argv: list[str] | None = None) -> list[Leftover]:
    args = parse_args(argv)
    from pipeline.config import load_paths

    paths = load_paths(args.params)
    found = train_leftovers(Path(paths.train_dir)) + staging_leftovers(paths)
    found += trial_leftovers(args.work_dir, args.results_dir, args.storage)
    if not found:
        print("nothing to clean")
        return found
    width = max(len(str(item.path)) for item in found)
    for item in found:
        status = "removable" if item.removable else "kept"
        print(f"{str(item.path).ljust(width)}  {human_size(item.size):>9}  {status}: {item.why}")
    removable = [item for item in found if item.removable]
    total = human_size(sum(item.size for item in removable))
    if not removable:
        print("nothing removable")
    elif args.yes:
        for item in removable:
            shutil.rmtree(item.path)
        print(f"removed {total} in {len(removable)} folder(s)")
    else:
        print(f"removable: {total} in {len(removable)} folder(s); run again with --yes to remove")
    return found


def console() -> None:
    """The `transformer-clean` command (pyproject.toml)."""
    main(lambda: clean(sys.argv[1:]))


if __name__ == "__main__":
    console()
