"""A study's pin: the code version, hardware class and precision every trial of it runs at.

A long study crosses many machines and many days; its trials compare only when they ran the
same code on the same kind of machine at the same precision (a change of any of them moves one
seed's BLEU by more than many of Table 3's effects). The worker that creates a study records
the three as the study's user attribute `pin`; every later worker checks its own before it
claims a trial and refuses (exit 2) where one differs, saying how to run at the pin (a git
worktree at the pinned commit), or goes on under `--allow-mixed`, whose trials the report
shows apart (their records carry their own commit, hardware and precision).

- code version: the commit of the checkout the worker's code comes from; uncommitted changes
  to the code, configuration or study specs make it `<commit>+dirty.<hash of the changes>`,
  which matches only the same changes (the study's own results folder is not code); the same
  name every trial's records carry (`environment.code_commit`).
- hardware class: `environment.run_class` (the processor or GPU and its bf16 kernels, without
  the core or device count, and the processes a trial trains on where more than one: with
  `train.devices: auto` a machine of another GPU count would train with another global batch).
- precision: `train.precision: auto` is decided once, by the creator (its timing probe can
  come out otherwise on a busy machine), and every trial of the study with `auto` trains at
  the pinned precision; a worker whose config sets another precision differs.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from pipeline.atomic import write_json_atomic
from pipeline.environment import (
    COMMIT_ENV,
    REPO_ROOT,
    code_commit,
    hardware,
    machine_and_processes,
    run_class,
)
from pipeline.errors import ConfigError
from pipeline.sweep.spec import StudySpec, point_config

AUTO = "auto"
PIN_ATTR = "pin"  # the study's user attribute that holds its pin
# The pin beside the study's records, for a report that reads no storage (a study on a
# database server has no study.db in its results folder)
PIN_FILE = "pin.json"


@dataclass(frozen=True)
class Pin:
    commit: str
    hardware: str
    precision: str

    @classmethod
    def from_attr(cls, value: Any) -> Pin | None:
        if not isinstance(value, dict):
            return None
        return cls(**{key: str(value.get(key)) for key in ("commit", "hardware", "precision")})


UNKNOWN_COMMIT = "unknown"


def running_commit(repo: Path | None = None) -> str:
    """The commit of the code that runs, `+dirty.<8 hex>` when its code has uncommitted changes
    (the commit every record of a trial names, `environment.code_commit`); UNKNOWN_COMMIT
    outside a checkout."""
    return code_commit(repo) or UNKNOWN_COMMIT


def check_commit_known() -> None:
    """Refuse a worker whose code names no commit (a copied tree without git's history and no
    COMMIT_ENV): its trials would all match one pin, "unknown", whatever code they ran."""
    if running_commit() == UNKNOWN_COMMIT:
        raise ConfigError(
            f"this worker's code ({REPO_ROOT}) is in no git checkout, so a study could not pin "
            "the code its trials run: run it from a clone, or, in a copied tree, set "
            f"{COMMIT_ENV} to the commit the tree was copied from"
        )


def _first_point(spec: StudySpec):
    """The config of the study's first point, where the study's precision is decided."""
    first = spec.grid()[0] if spec.kind == "grid" else {"seed": spec.seeds[0]}
    return point_config(
        spec, {**spec.variants.get(first.get("variant"), {}), "seed": first["seed"]}
    )


def configured_precision(spec: StudySpec) -> str:
    """`train.precision` of the study's first point (`auto` unless the recipe sets one)."""
    return _first_point(spec).train.precision


def resolved_precision(spec: StudySpec) -> str:
    """The precision `auto` picks here for the study's model (its timing probe on a CPU)."""
    from pipeline.training.hardware import resolve_accelerator
    from pipeline.training.precision import resolve_precision

    cfg = _first_point(spec)
    return resolve_precision(
        cfg.train.precision, resolve_accelerator(cfg.train.accelerator),
        d_model=cfg.model.d_model, d_ff=cfg.model.d_ff,
        min_speedup=cfg.runtime.bf16_min_speedup,
    )  # fmt: skip


def trial_processes(spec: StudySpec) -> int:
    """The processes each of the study's trials trains on here: `train.num_nodes` x the devices
    `train.devices` resolves to on this machine."""
    from pipeline.training.hardware import device_count, resolve_accelerator

    train = _first_point(spec).train
    return train.num_nodes * device_count(train.devices, resolve_accelerator(train.accelerator))


def this_worker(spec: StudySpec, pinned: Pin | None = None) -> Pin:
    """This worker's code version, hardware class and precision (the one its trials train
    at). `auto` on the pinned hardware class is the pinned precision, without a timing probe."""
    machine = run_class(hardware(), trial_processes(spec))
    configured = configured_precision(spec)
    if configured != AUTO:
        precision = configured
    elif pinned is not None and pinned.hardware == machine:
        precision = pinned.precision
    else:
        precision = resolved_precision(spec)
    return Pin(running_commit(), machine, precision)


def write_pin_file(study_results: Path, pinned: Pin) -> None:
    """The study's pin as `study_results`/PIN_FILE, committed with its records."""
    study_results.mkdir(parents=True, exist_ok=True)
    write_json_atomic(study_results / PIN_FILE, asdict(pinned))


def read_pin_file(study_results: Path) -> Pin | None:
    """The pin a worker wrote beside the study's records (None: none written)."""
    path = study_results / PIN_FILE
    return Pin.from_attr(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


def differences(pinned: Pin, worker: Pin) -> list[str]:
    """'commit: pinned X, this worker Y' for each field that differs."""
    return [
        f"{field}: pinned {value}, this worker {getattr(worker, field)}"
        for field, value in asdict(pinned).items()
        if getattr(worker, field) != value
    ]


def check_pin(study: optuna.Study, spec: StudySpec, worker: Pin, allow_mixed: bool) -> Pin | None:
    """Refuse (ConfigError, exit 2) a worker that differs from the study's pin, before it claims
    a trial, unless `allow_mixed`. Returns the pin (None: a study created before pins)."""
    pinned = Pin.from_attr(study.user_attrs.get(PIN_ATTR))
    if pinned is None:
        return None
    differ = differences(pinned, worker)
    if differ and not allow_mixed:
        commit = pinned.commit.split("+", 1)[0]
        machine, processes = machine_and_processes(pinned.hardware)
        worker_machine, worker_processes = machine_and_processes(worker.hardware)
        same_but_processes = not differences(pinned, replace(worker, hardware=pinned.hardware))
        if same_but_processes and worker_machine == machine:
            how = (
                f"Its trials train on {processes} process(es), this worker's would on "
                f"{worker_processes} "
                "(train.num_nodes x train.devices, which `auto` makes this machine's GPU "
                f"count): run it where a trial gets {processes}, e.g. with CUDA_VISIBLE_DEVICES "
                f"naming {processes} GPU(s)."
            )
        elif commit_known(commit):
            how = (
                f"Run its workers from a clean checkout of the pinned commit on a {machine} "
                f"machine: `git worktree add ../{spec.study}-pinned {commit}`, then the same "
                "command from there (--results-dir and --storage pointing at this study)."
            )
        else:
            how = (
                f"The pinned commit {commit} is not in this repository: fetch it, or, if it is "
                "gone for good, start the study over (set its study.db and trials/ aside; its "
                "next worker pins it anew)."
            )
        raise ConfigError(
            f"study '{spec.study}' is pinned and this worker differs ({'; '.join(differ)}). "
            f"{how} Or pass --allow-mixed to run anyway: its trials are then reported apart "
            f"from the pinned ones."
        )
    return pinned


def commit_known(commit: str, repo: Path | None = None) -> bool:
    """Whether the git repository at `repo` (the working folder's) holds `commit`."""
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo,
                           capture_output=True, check=False)  # fmt: skip
    return found.returncode == 0
