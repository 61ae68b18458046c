"""Optuna ablation sweeps: `python -m pipeline.sweep ablations/<spec>.yaml [--storage URL] [--n-trials N]`.

The command line of a worker (or of N workers on one machine, `--workers N`), and of the study's
maintenance: `--retry-failed`, `--git-add`.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli import PIPELINE_FILE, main
from pipeline.config import CONF_DIR
from pipeline.errors import ConfigError
from pipeline.redaction import hide_password
from pipeline.sweep.spec import RESULTS_ROOT, WORK_ROOT

if TYPE_CHECKING:
    from pipeline.sweep.deadline import Deadline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("spec", help="study spec, e.g. ablations/table3.yaml")
    parser.add_argument("--storage", help="SQLAlchemy URL (default: SQLite under the results dir)")
    parser.add_argument("--n-trials", type=int, help="run at most this many trials in this worker")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_ROOT,
        help="where the study's folder (its records and SQLite storage) is kept "
        f"(default: {RESULTS_ROOT})",
    )
    parser.add_argument(
        "--git-add",
        action="store_true",
        help="run no trial: stage the study's records and a consistent copy of its SQLite "
        "storage for a commit (safe while workers run)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="run no trial: queue again every grid point whose last attempt failed with an "
        "error (after fixing its cause); workers then resume it from its checkpoint",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=WORK_ROOT,
        help="where trials keep checkpoints and other bulky outputs (outside the repository); "
        "an interrupted point resumes from its checkpoint here",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="start this many workers on this machine, sharing its device (threads = cores / "
        "N each; CUDA MPS where installed); see pipeline.sweep.launch",
    )
    parser.add_argument(
        "--deadline",
        help="stop by this time: a duration (2h30m) or a local clock time (18:40, the next one): "
        "start only trials expected to finish by then, stop a running one at a checkpoint at the "
        "deadline and exit 0 (for a scheduler's time limit, a spot instance, a machine held for "
        "some hours)",
    )
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="run even where this worker's commit, hardware class or precision differs from "
        "the study's pin (its trials are then reported apart from the pinned ones)",
    )
    parser.add_argument(
        "--allow-large-grid",
        action="store_true",
        help="run a grid of more points (variants x seeds) than the spec's "
        "settings.max_grid_points: its creator enqueues every point at once",
    )
    parser.add_argument(
        "--commit",
        action="store_true",
        help="git commit the study's records and storage after each finished trial (only "
        "them, in the checkout that holds --results-dir)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.n_trials is not None and args.n_trials < 0:
        parser.error(f"--n-trials must be >= 0, got {args.n_trials}")
    return args


def repository_root(folder: Path) -> Path | None:
    """The checkout that `folder` is in (itself or the nearest folder above it holding
    dvc.yaml and conf/), or None."""
    folder = folder.resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / PIPELINE_FILE).is_file() and (candidate / CONF_DIR.name).is_dir():
            return candidate
    return None


def check_working_folder(spec: str) -> None:
    """A study's relative paths are its repository's: the results folder (`ablations/results`)
    and the corpus (`data.raw_dir`, `../shared/data/multi30k`). Run from anywhere else they
    would name other places (a second study under ablations/ablations/results, a corpus not
    found and downloaded), so the command runs only from the root of the repository that
    holds the spec (any repository's root for a spec kept outside one)."""
    here = Path.cwd().resolve()
    root = repository_root(Path(spec).resolve().parent) or repository_root(here)
    if root == here:
        return
    if root is None:
        raise ConfigError(
            f"{spec}: neither the spec nor the current folder {here} is in a repository "
            f"checkout (a folder with {PIPELINE_FILE} and {CONF_DIR.name}/): run the sweep "
            "from the repository's root"
        )
    shown = Path(os.path.relpath(Path(spec).resolve(), root))
    shown = shown if shown.parts[:1] != (os.pardir,) else Path(spec).resolve()
    raise ConfigError(
        f"{spec}: run the sweep from the root of the repository {root}, not {here}: the "
        f"study's results ({RESULTS_ROOT}/) and its corpus (data.raw_dir) are found from "
        f"there. cd {root} && python -m pipeline.sweep {shown}"
    )


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_working_folder(args.spec)
    # The spec is checked first, and Optuna, torch and Lightning load only after it: `--help`
    # and a bad spec are answered at once.
    from pipeline.sweep.spec import load_spec, overrides_text

    spec = load_spec(args.spec, allow_large_grid=args.allow_large_grid)
    from pipeline.sweep import launch
    from pipeline.sweep.claims import retry_failed
    from pipeline.sweep.ddp import TRIAL_ENV
    from pipeline.sweep.deadline import parse_deadline
    from pipeline.sweep.storage import default_storage, git_add_study, open_storage, open_study
    from pipeline.sweep.trial import run_trial_rank
    from pipeline.sweep.worker import run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    storage = args.storage or default_storage(spec, args.results_dir)
    if args.git_add:
        git_add_study(args.results_dir / spec.study)
        return
    if args.retry_failed:
        if spec.kind != "grid":
            raise ConfigError(f"{args.spec}: --retry-failed is for grid studies (a search "
                              "draws new trials in place of failed ones)")  # fmt: skip
        study = open_study(spec, open_storage(storage, spec.settings))
        queued = retry_failed(study)
        for point in queued:
            print(f"queued again: {overrides_text(point)}")
        print(f"{len(queued)} failed point(s) of study '{spec.study}' queued again")
        return
    if TRIAL_ENV in os.environ:  # a DDP rank of a trial, launched by Lightning (see above)
        run_trial_rank(spec, storage, args.results_dir, int(os.environ[TRIAL_ENV]), args.work_dir)
        return
    deadline = parse_deadline(args.deadline) if args.deadline else None
    if args.workers > 1:
        command = launch.worker_command(args.spec, storage, args.results_dir, args.work_dir,
                                        args.n_trials, worker_flags(args, deadline))  # fmt: skip
        code = launch.launch_workers(command, args.workers)
        if code == 0:  # the study once, not once per worker
            study = open_study(spec, open_storage(storage, spec.settings))
            print(closing(study, spec, args, storage))
        raise SystemExit(code)
    study = run_worker(spec, storage, args.results_dir, args.n_trials, work_root=args.work_dir,
                       deadline=deadline, allow_mixed=args.allow_mixed,
                       commit=args.commit)  # fmt: skip
    if os.environ.get(launch.WORKER_ENV) is None:  # the launcher of several workers says it
        print(closing(study, spec, args, storage))


def closing(study, spec, args: argparse.Namespace, storage: str) -> str:
    """What a sweep ends with: the finished trials, where the study and its trials' folders
    are, and the commands that show it."""
    from pipeline.disk_usage import leftovers_message
    from pipeline.sweep.claims import FINISHED, count_trials, study_id
    from pipeline.sweep.summary import study_summary, where_to_look
    from pipeline.sweep.work_dirs import study_work_dir

    shown = hide_password(storage)
    study_dir = study_work_dir(args.work_dir, spec.study, storage, study_id(study))
    return "\n".join((
        study_summary(study, spec),
        f"study '{spec.study}': {count_trials(study, FINISHED)} finished trials in {shown}",
        f"trial work folders: {leftovers_message([study_dir])}",
        where_to_look(args.spec, shown, args.results_dir),
    ))  # fmt: skip


def worker_flags(args: argparse.Namespace, deadline: Deadline | None) -> list[str]:
    """The flags the launcher passes on to each of its workers (one deadline for all)."""
    flags = ["--deadline", deadline.iso()] if deadline is not None else []
    flags += ["--allow-mixed"] if args.allow_mixed else []
    flags += ["--allow-large-grid"] if args.allow_large_grid else []
    return flags + (["--commit"] if args.commit else [])


def console() -> None:
    """The `transformer-sweep` command (pyproject.toml)."""
    main(cli)
