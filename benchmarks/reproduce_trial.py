"""Whether this machine computes what the machine that ran a study's trial computed.

    cd <the study's pinned worktree>
    .venv/bin/python <any checkout>/benchmarks/reproduce_trial.py \
        <results>/<study>/trials/base-seed1 --out reproduce.json

A study pins a hardware class by name ("AMD EPYC, avx512_bf16"), and two CPUs of one name can
still run different kernels. This re-runs the trial's own training, with the code of the
checkout it runs in, up to the record's first validation, and compares the val loss and the
greedy val BLEU there with the record, bit for bit. Those steps are the record's own: data
order and dropout come from the seed, the thread count and precision from `run.json`, and the
learning rate of a step before the cool-down does not depend on the budget. Exit 0: identical
(the two machines trained alike); 1: they differ (another kernel, library or machine: trials of
the two do not belong in one comparison); 2: the record cannot be reproduced here (another
commit, a missing file).

It imports only what every commit of the pipeline with pinned studies has (`pipeline.config`,
`pipeline.training.trainer`, `pipeline.sweep.pin` and `.trial`), so one copy serves any pinned
worktree: the code that trains is the worktree's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

# The thread knobs a worker sets for its trainer (pipeline.sweep.launch.THREAD_ENVS), set
# before torch is imported, as the worker's launcher does: at older commits importing that
# module loads torch first (through pipeline.sweep's eager imports), hence this copy.
THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
COMPARED = ("val/loss", "val/greedy_bleu")  # logged at every validation since the first records
# Greedy validation BLEU was `val/bleu` at the commits of the first studies (a copy of
# pipeline.metric_names.FORMER_LOGGED: those commits have no such module).
FORMER_NAMES = {"val/bleu": "val/greedy_bleu"}
CPU_FIELDS = ("model name", "cpu family", "model", "stepping")
CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def current_names(values: dict) -> dict:
    return {FORMER_NAMES.get(key, key): value for key, value in values.items()}


class Unreproducible(Exception):
    """The record cannot be re-run here as it ran (exit 2)."""


def read_record(trial_dir: Path) -> tuple[dict, list[dict], Path]:
    """run.json, curve.json and the path of params.yaml of one trial's record folder."""
    names = ("run.json", "curve.json", "params.yaml")
    missing = [name for name in names if not (trial_dir / name).is_file()]
    if missing:
        raise Unreproducible(f"{trial_dir}: no {', '.join(missing)} (a trial's record folder?)")
    run = json.loads((trial_dir / "run.json").read_text(encoding="utf-8"))
    points = json.loads((trial_dir / "curve.json").read_text(encoding="utf-8"))
    curve = [current_names(point) for point in points]
    if not curve or not all(key in curve[0] for key in ("step", *COMPARED)):
        raise Unreproducible(f"{trial_dir / 'curve.json'}: no first validation with {COMPARED}")
    return run, curve, trial_dir / "params.yaml"


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """This CPU as the kernel names it: the model fields and the flags that choose kernels
    (pipeline.environment.cpuinfo is newer than the first pinned studies)."""
    found: dict = {"machine": platform.machine(), "cores": os.cpu_count()}
    flags: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in CPU_FIELDS and key not in found:
                found[key] = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    found["flags"] = [flag for flag in CPU_FLAGS if flag in flags]
    return found


def first_validation_config(params: Path, work: Path, run: dict, step: int):
    """The record's config, trained up to `step` only, with its outputs under `work`."""
    from pipeline import config as config_lib

    cfg = config_lib.load(params)
    train = cfg.train
    if step % train.val_check_interval or step > train.max_steps - train.cooldown_steps:
        raise Unreproducible(
            f"{params}: the first validation (step {step}) is not a validation before the "
            f"cool-down of {train.cooldown_steps} steps of {train.max_steps}"
        )
    train.max_steps, train.cooldown_steps = step, 0
    train.precision = run["precision"]
    train.resume = False
    cfg.logger.wandb.mode = "disabled"
    for name in ("train_dir", "eval_dir", "metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(work / name.removesuffix("_dir")))
    return cfg


def reproduce(trial_dir: Path, work: Path, any_commit: bool = False) -> dict:
    """Re-run the trial at `trial_dir` up to its first validation; the comparison as a dict."""
    run, curve, params = read_record(trial_dir)
    for name in THREAD_ENVS:
        os.environ[name] = str(run["threads"])
    import torch

    from pipeline.sweep.pin import running_commit
    from pipeline.sweep.trial import ensure_data
    from pipeline.training import trainer

    commit = running_commit()  # `+dirty.<hash>` if the code here has changed
    if not any_commit and commit != run["commit"]:
        raise Unreproducible(
            f"{trial_dir}: recorded at commit {run['commit']}, and the code here is at {commit}: "
            f"run it in a clean worktree at {run['commit']} (or pass --any-commit to compare "
            "code too)"
        )
    torch.set_num_threads(int(run["threads"]))
    recorded = curve[0]
    cfg = first_validation_config(params, work, run, int(recorded["step"]))
    ensure_data(cfg, work / "data")
    measured = current_names(trainer.run(cfg)["last"])
    spm = Path(cfg.paths.tokenized) / "spm.model"
    return {
        "record": "/".join(trial_dir.resolve().parts[-3:]),  # <study>/trials/<trial>
        "recorded_on": run["hardware"],
        "recorded_commit": run["commit"],
        "commit": commit,
        "step": int(recorded["step"]),
        "threads": int(run["threads"]),
        "precision": run["precision"],
        "recorded": {key: recorded[key] for key in COMPARED},
        "measured": {key: measured[key] for key in COMPARED},
        "identical": all(recorded[key] == measured[key] for key in COMPARED),
        "machine": cpu_description(),
        "torch": torch.__version__,
        "subword_model_sha256": hashlib.sha256(spm.read_bytes()).hexdigest(),
    }


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reproduce_trial.py", description=__doc__.split("\n")[0])
    parser.add_argument("trial", type=Path, help="a trial's record folder (run.json, ...)")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=None, help="also write the result here")
    parser.add_argument("--any-commit", action="store_true",
                        help="run with this checkout's code whatever it is")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="reproduce-trial-") as scratch:
            result = reproduce(args.trial, args.work or Path(scratch), args.any_commit)
    except Unreproducible as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    verdict = "identical" if result["identical"] else "differs"
    print(f"{verdict}: step {result['step']}, recorded {result['recorded']} "
          f"({result['recorded_on']}), measured {result['measured']}", file=sys.stderr)  # fmt: skip
    print(json.dumps(result))  # the last line of stdout, as every benchmark's (common.print_json)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(cli())
