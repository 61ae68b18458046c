"""A finished trial's record (`<results-dir>/<study>/trials/<point>/`): metrics, params, hypotheses,
validation curve and run info, committed with the study; and the log of the point's training
attempts that the record sums."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import optuna
import yaml

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.errors import Preempted
from pipeline.metric_names import GREEDY_VAL_BLEU, current_names
from pipeline.portable_paths import copy_relativized, relativize
from pipeline.sweep.deadline import WALL_TIME_ATTR
from pipeline.sweep.spec import TrialPaths
from pipeline.sweep.summary import TEST_ATTR

# What val/loss (hence val/ppl) and train/loss average over (pipeline.training.module's
# TokenMean), written into each record: runs logged before TokenMean carry no such key and
# averaged batch means instead.
LOSS_AVERAGE = "target_token"

RUN_FILE = "run.json"  # written last: a record folder with it is a finished trial


ATTEMPTS_FILE = "attempts.jsonl"  # in the work dir: the point's attempts (`read_attempts`)


CURVE_METRICS = (GREEDY_VAL_BLEU, "val/loss", "val/ppl")
CURVE_FILE = "curve.json"  # in a point's record folder: its validation curve


def training_threads() -> int:
    """The threads torch trains on in this process; torch is imported here, by the worker that
    trains (which has it loaded), so that a report reading records starts without it."""
    import torch

    return torch.get_num_threads()


class _Attempt:
    """An attempt in progress: `trained()` once its training has ended (the wall time it
    records is training's; evaluation's is the record's own figure)."""

    def __init__(self, work: Path, base: dict) -> None:
        self.work, self.base = work, base
        self.started = time.perf_counter()
        self.train_wall: float | None = None

    def trained(self) -> None:
        self.train_wall = round(time.perf_counter() - self.started, 1)
        self.log(TRAINED)

    def log(self, outcome: str) -> None:
        wall = self.train_wall
        if wall is None:
            wall = round(time.perf_counter() - self.started, 1)
        step = _checkpoint_step(self.work)
        _append_attempt(self.work, {**self.base, "outcome": outcome, "step": step,
                                    "wall_time_s": wall})  # fmt: skip


@contextlib.contextmanager
def logged_attempt(work: Path, trial: optuna.Trial):
    """Log each attempt at the point (trial, steps, training's wall time, machine) in its work
    dir, also for an attempt that was preempted or killed: the record sums them. The block
    trains and evaluates, calling `trained()` in between; an attempt is finished only once
    both are done.

    A line saying the attempt started comes first, one when its training ended, and its
    outcome when it ends. A SIGKILL leaves no outcome: the next attempt at the point counts
    that one killed, at the step of the newest checkpoint it left, for the time until the last
    file it wrote in training (or its training's time, killed while it evaluated)."""
    from pipeline.environment import hardware

    base = {"trial": trial.number, "hardware": hardware(), "threads": training_threads()}
    _close_killed_attempts(work)
    start = {"outcome": STARTED, "step": _checkpoint_step(work), "wall_time_s": 0.0}
    _append_attempt(work, {**base, **start, "started_at": time.time()})
    attempt = _Attempt(work, base)
    outcome = "interrupted"
    try:
        yield attempt
        outcome = "finished"
    except Preempted:
        outcome = "preempted"
        raise
    finally:
        attempt.log(outcome)


STARTED = "started"  # an attempt's first line; its last says how it ended
TRAINED = "trained"  # its training ended; evaluation follows


def _append_attempt(work: Path, line: dict) -> None:
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ATTEMPTS_FILE, "a", encoding="utf-8") as attempts:
        attempts.write(json.dumps(line) + "\n")


def read_attempts(work: Path) -> list[dict]:
    """The point's attempts in the order they started, each as its last line says."""
    path = work / ATTEMPTS_FILE
    if not path.exists():
        return []
    latest: dict[int, dict] = {}
    for text in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):  # a line cut short by a kill
            line = json.loads(text)
            latest[line["trial"]] = {**latest.get(line["trial"], {}), **line}
    return list(latest.values())


def _checkpoint_step(work: Path) -> int:
    """The step of the point's newest checkpoint (0 for none)."""
    progress = work / "train" / "checkpoints" / "progress.json"
    return json.loads(progress.read_text())["step"] if progress.exists() else 0


def _close_killed_attempts(work: Path) -> None:
    """Record the attempts that started but never ended (their process was killed) as killed:
    at the step of the newest checkpoint (where the next attempt resumes), for the time until
    the last checkpoint or history row written at the point (training's time, where training
    had ended)."""
    step = _checkpoint_step(work)
    written = [work / "train" / "checkpoints", work / "plots"]
    last_write = max((p.stat().st_mtime for d in written if d.is_dir() for p in d.rglob("*")),
                     default=0.0)  # fmt: skip
    for attempt in read_attempts(work):
        if attempt["outcome"] not in (STARTED, TRAINED):
            continue
        wall = attempt["wall_time_s"]  # killed while it evaluated: its training's time
        if attempt["outcome"] == STARTED:
            wall = round(max(0.0, last_write - attempt["started_at"]), 1)
        killed = {"outcome": "killed", "step": max(step, attempt["step"]), "wall_time_s": wall}
        _append_attempt(work, {**attempt, **killed})


def record_trial(
    trial, cfg, paths: TrialPaths, train_metrics, eval_metrics, eval_seconds
) -> list[dict[str, float]]:
    """Copy what the report needs into the point's record folder (committed with the study) and
    keep the headline numbers on the trial itself. `run.json` is written last. Returns the
    validation curve it recorded."""
    from pipeline.environment import provenance

    record = paths.record
    record.mkdir(parents=True, exist_ok=True)
    # Paths under the work root are recorded relative to it: no machine's home in a record.
    for name in ("train.json", "eval.json"):
        copy_relativized(
            Path(cfg.paths.metrics_dir) / name, record / name, Path.cwd(), paths.work_root
        )
    for hypotheses in sorted(Path(cfg.paths.eval_dir).glob("*.hyp")):
        shutil.copyfile(hypotheses, record / hypotheses.name)
    params = yaml.safe_dump(config_lib.to_dict(cfg), sort_keys=False)
    write_text_atomic(record / "params.yaml", relativize(params, Path.cwd(), paths.work_root))
    curve = validation_curve(cfg)
    write_json_atomic(record / CURVE_FILE, curve)
    attempts = [
        {key: value for key, value in attempt.items() if key != "started_at"}
        for attempt in read_attempts(paths.work)
    ]
    run = {
        "trial": trial.number,
        "params": trial.params,
        **provenance(),
        "precision": train_metrics.get("precision"),
        "loss_average": LOSS_AVERAGE,
        "threads": training_threads(),
        "train_wall_time_s": round(sum(a["wall_time_s"] for a in attempts), 1),
        "eval_wall_time_s": round(eval_seconds, 1),
        "attempts": attempts,
    }
    write_json_atomic(record / RUN_FILE, run)

    test_split = cfg.data.test_splits[0] if cfg.data.test_splits else None
    test = eval_metrics.get(test_split, {}) if test_split else {}
    attrs = {
        "val_greedy_bleu": train_metrics.get(GREEDY_VAL_BLEU),
        "val_ppl": train_metrics.get("val/ppl"),
        "test_bleu": test.get("bleu"),
        TEST_ATTR: test.get("bleu_lc"),
        "test_chrf": test.get("chrf"),
        "parameters": train_metrics.get("num_parameters"),
        "record": record.name,
        "checkpoint_dir": relativize(
            str(Path(cfg.paths.train_dir).resolve()), Path.cwd(), paths.work_root
        ),
        # what a worker's --deadline expects a trial of this variant to take
        WALL_TIME_ATTR: round(run["train_wall_time_s"] + run["eval_wall_time_s"], 1),
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return curve


def read_curve(path: Path) -> list[dict[str, float]]:
    """A record's validation curve (`CURVE_FILE`), its metrics under today's names."""
    return [current_names(point) for point in json.loads(path.read_text(encoding="utf-8"))]


def validation_curve(cfg: config_schema.Config) -> list[dict[str, float]]:
    """Every validation of the run by step ({"step", "val/greedy_bleu", "val/loss", "val/ppl"}), from
    DVCLive's files, which a resumed run appends to (a step logged twice keeps its last row)."""
    from pipeline.training.trainer import DVCLIVE_SUBDIR

    by_step: dict[int, dict[str, float]] = {}
    metrics = Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR / "plots" / "metrics"
    for key in CURVE_METRICS:
        path = metrics / f"{key}.tsv"
        if not path.exists():
            continue
        header, *rows = path.read_text(encoding="utf-8").splitlines()
        columns = header.split("\t")
        for row in rows:
            values = dict(zip(columns, row.split("\t")))
            step = int(values["step"])
            by_step.setdefault(step, {"step": step})[key] = float(values[key.split("/")[-1]])
    return [by_step[step] for step in sorted(by_step)]
