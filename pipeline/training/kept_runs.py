"""A train stage's run that DVC has not recorded, kept beside the stage's output until it has.

DVC deletes a stage output it has not recorded before it runs that stage again (`dvc exp run`
checks the whole workspace out first, `persist` or not), and it may end without recording a
run that trained to the end (`dvc` itself stopped by a signal; `params.yaml` rewritten
meanwhile by a second command, which DVC refuses but only after rewriting it). So a train
stage that DVC runs links the checkpoints it starts from and every one it saves into
`<train_dir>.preempted/checkpoints/` (hard links: no disk) and leaves them there however it
ends: stopped, finished or killed. Only its own: a second `dvc exp run` checks the workspace
out under a running stage (before DVC refuses it as busy), and the files it puts in the
output folder are never linked there.
The next train stage puts the run back: it resumes a stopped run, records a finished one
without training, and refuses other values naming the key (the run stays kept). The check
stage, which every DVC command runs first, forgets the links once DVC's cache holds the run's
newest checkpoint (DVC recorded it) and otherwise says what is kept and how to go on.

Nothing here imports torch: the check stage stays quick.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.dvc_env import DVC_ROOT, DVC_STAGE

PREEMPTED_SUFFIX = ".preempted"  # <train_dir>.preempted/: the run DVC has not recorded
REPLACED_SUFFIX = ".replaced"  # <train_dir>.replaced/<time>/: runs a fresh run moved aside
RUN_RECORD = "run.json"  # in it: the experiment and step count of the run kept there
# The names `pipeline.training.checkpoints` gives them (that module imports torch).
CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
PROGRESS = "progress.json"
MD5_CHUNK = 1 << 20


def under_dvc() -> bool:
    """Whether this process is a stage DVC runs (`dvc repro`, `dvc exp run`)."""
    return bool(os.environ.get(DVC_STAGE))


def kept_folder(train_dir: str | os.PathLike) -> Path:
    """`<train_dir>.preempted`: beside the stage's output, not part of it."""
    train_dir = Path(train_dir)
    return train_dir.with_name(train_dir.name + PREEMPTED_SUFFIX)


def kept_checkpoints(train_dir: str | os.PathLike) -> Path:
    return kept_folder(train_dir) / CHECKPOINTS


def note_run(train_dir: str | os.PathLike, experiment: str, max_steps: int) -> None:
    """Record which run the kept checkpoints belong to (what the check stage says of them)."""
    folder = kept_folder(train_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / RUN_RECORD, {"experiment": experiment, "max_steps": max_steps})


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def kept_state(train_dir: str | os.PathLike) -> tuple[int | None, dict]:
    """(the step of the kept run's newest checkpoint, its record); (None, {}) when none is
    kept."""
    stash = kept_checkpoints(train_dir)
    if not stash.is_dir() or not any(p.suffix == ".ckpt" for p in stash.iterdir()):
        return None, {}
    step = _read_json(stash / PROGRESS).get("step")
    return (step if isinstance(step, int) else -1), _read_json(kept_folder(train_dir) / RUN_RECORD)


def is_finished(step: int | None, record: dict) -> bool:
    return step is not None and step >= record.get("max_steps", float("inf"))


def describe(train_dir: str | os.PathLike) -> str | None:
    """What is kept and what the next train stage does with it (None: nothing kept)."""
    step, record = kept_state(train_dir)
    if step is None:
        return None
    of = f"experiment '{record['experiment']}', " if "experiment" in record else ""
    where = kept_checkpoints(train_dir)
    at = f"step {step}" if step >= 0 else "its newest checkpoint"
    replaced = Path(train_dir).with_name(Path(train_dir).name + REPLACED_SUFFIX)
    if is_finished(step, record):
        what, then = f"finished at {at}", "records it without training"
        other = f"other values move it to {replaced}/ (kept, not recorded)"
    else:
        total = f" of {record['max_steps']}" if "max_steps" in record else ""
        what, then = f"stopped at {at}{total}", f"resumes it from {at}"
        other = (
            f"other values are refused naming the key (train.resume=false moves it to {replaced}/)"
        )
    return (
        f"{where} keeps a run DVC has not recorded ({of}{what}): the train stage of a command "
        f"with its values {then}; {other}"
    )


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(MD5_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _dvc_cache(root: Path) -> Path | None:
    """DVC's local cache folder of the repository at `root` (None without DVC)."""
    if not (root / ".dvc").is_dir():
        return None
    from dvc.config import Config  # DVC's own reading of .dvc/config and config.local

    configured = Config(str(root / ".dvc")).get("cache", {}).get("dir")
    return Path(configured) if configured else root / ".dvc" / "cache"


def recorded_by_dvc(path: Path, root: Path | None = None) -> bool:
    """Whether DVC's cache holds a file with `path`'s content (DVC caches a stage's outputs
    when it records them)."""
    root = root or Path(os.environ.get(DVC_ROOT) or ".")
    cache = _dvc_cache(root)
    if cache is None or not path.is_file():
        return False
    md5 = _md5(path)
    return (cache / "files" / "md5" / md5[:2] / md5[2:]).is_file()


def forget_if_recorded(train_dir: str | os.PathLike) -> bool:
    """Remove the kept links of a run whose newest checkpoint DVC's cache holds; returns
    whether it did."""
    stash = kept_checkpoints(train_dir)
    if not recorded_by_dvc(stash / LAST):
        return False
    for path in stash.iterdir():
        if path.is_file():
            path.unlink()
    (kept_folder(train_dir) / RUN_RECORD).unlink(missing_ok=True)
    return True


def review(train_dir: str | os.PathLike) -> str | None:
    """For the check stage: forget a kept run DVC has recorded since; otherwise say what is
    kept (None: nothing)."""
    if kept_state(train_dir)[0] is None or forget_if_recorded(train_dir):
        return None
    return describe(train_dir)
