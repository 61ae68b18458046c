"""Sweep worker layout: on a small CPU machine, do N workers of one thread each finish trials
faster than one worker with N threads? And trials per hour of the product's own launcher.

    python -m benchmarks.sweep_workers [--cores 2] [--steps 200] [overrides]
    python -m benchmarks.sweep_workers --through-sweep 1 2 4 [--spec ablations/smoke.yaml]

`--through-sweep N...` runs the whole study of `--spec` once per N with
`python -m pipeline.sweep SPEC --workers N` (fresh SQLite storage, results and work folders
in a temp dir; each worker gets cores / N threads, CUDA MPS on a GPU where installed) and
reports its wall time and finished trials per hour: the number that picks `--workers`.

Each layout trains `--cores` identical short runs with the real training loop
(`pipeline.training.trainer.run`, the code path of a sweep trial: data loading, bf16/fp32 as
`precision: auto` picks, validation with greedy val BLEU once at the end):
  one worker   the runs one after another in one process each, `--cores` threads
  workers      the runs at the same time, one process each, one thread each
and reports the wall time of each layout for the same work, and their ratio. Both layouts
pay the same per-process start-up (imports, data, the loss's compile from inductor's cache),
which a real trial pays once per tens of minutes: use enough `--steps` that training
dominates. The runs train on the tokenized study data in a temp dir (prepared once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import base_parser, print_json, print_table
from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.environment import provenance

CHILD_FLAG = "--child"


def _config(overrides: list[str], steps: int, work: Path) -> config_schema.Config:
    return config_lib.compose(
        [
            "experiment=multi30k_tiny",
            *overrides,
            f"train.max_steps={steps}",
            f"train.val_check_interval={steps}",
            "train.progress_bar=false",
            "logger.wandb.mode=disabled",
            f"paths.prepared={work / 'data' / 'prepared'}",
            f"paths.tokenized={work / 'data' / 'tokenized'}",
            f"paths.train_dir={work / 'train'}",
            f"paths.metrics_dir={work / 'metrics'}",
            f"paths.plots_dir={work / 'plots'}",
            f"paths.wandb_dir={work / 'wandb'}",
        ]
    )


def _child(overrides: list[str], steps: int, work: Path) -> None:
    from pipeline.training import trainer

    summary = trainer.run(_config(overrides, steps, work))
    print(json.dumps({"tokens_per_sec": summary["train/tokens_per_sec"]}))


def _launch(overrides: list[str], steps: int, work: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "benchmarks.sweep_workers", CHILD_FLAG, str(work)]
    command += ["--steps", str(steps), *overrides]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> float:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a benchmark run failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1])["tokens_per_sec"]


def trials_per_hour(spec: str, workers: list[int]) -> list[dict]:
    """The study of `spec` run to its end once per number of workers, through the sweep CLI."""
    import optuna

    from pipeline.sweep import FINISHED, load_spec

    study = load_spec(spec).study
    rows = []
    for n in workers:
        with tempfile.TemporaryDirectory(prefix=f"sweep-{n}-workers-") as tmp:
            results, work = Path(tmp) / "results", Path(tmp) / "work"
            command = [sys.executable, "-m", "pipeline.sweep", spec, "--workers", str(n),
                       "--results-dir", str(results), "--work-dir", str(work)]  # fmt: skip
            env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
            started = time.perf_counter()
            subprocess.run(command, env=env, check=True)
            seconds = time.perf_counter() - started
            storage = f"sqlite:///{results / study / 'study.db'}"
            trials = optuna.load_study(study_name=study, storage=storage).get_trials(
                deepcopy=False, states=FINISHED
            )
        rows.append({"workers": n, "trials": len(trials), "wall_s": seconds,
                     "trials_per_hour": 3600 * len(trials) / seconds})  # fmt: skip
    return rows


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument("--through-sweep", type=int, nargs="+", metavar="N", default=None,
                        help="trials/hour of `pipeline.sweep --spec --workers N` for each N")  # fmt: skip
    parser.add_argument("--spec", default="ablations/smoke.yaml")
    parser.add_argument(CHILD_FLAG, type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.overrides, args.steps, args.child)
        return
    if args.through_sweep:
        rows = trials_per_hour(args.spec, args.through_sweep)
        print_table(["workers", "trials", "wall time (s)", "trials per hour"],
                    [[r["workers"], r["trials"], r["wall_s"], r["trials_per_hour"]] for r in rows])  # fmt: skip
        print_json({"benchmark": "sweep_workers", "spec": args.spec, "through_sweep": rows,
                    "hardware": provenance()["hardware"]})  # fmt: skip
        return
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenizer import tokenize

    with tempfile.TemporaryDirectory(prefix="sweep-workers-") as tmp:
        root = Path(tmp)
        data_cfg = _config(args.overrides, args.steps, root)
        prepare(data_cfg)
        tokenize(data_cfg)

        def work_dir(layout: str, run: int) -> Path:
            directory = root / f"{layout}-{run}"
            directory.mkdir()
            (directory / "data").symlink_to(root / "data")
            return directory

        started = time.perf_counter()
        one_rates = []
        for run in range(args.cores):
            proc = _launch(args.overrides, args.steps, work_dir("one", run), args.cores)
            one_rates.append(_finish(proc))
        one_worker = time.perf_counter() - started

        started = time.perf_counter()
        procs = [
            _launch(args.overrides, args.steps, work_dir("many", run), 1)
            for run in range(args.cores)
        ]
        many_rates = [_finish(p) for p in procs]
        many_workers = time.perf_counter() - started

    print_table(
        ["layout", "runs", "wall time (s)", "target tokens/s per run", "runs per hour"],
        [
            [f"1 worker x {args.cores} threads", args.cores, one_worker,
             sum(one_rates) / len(one_rates), 3600 * args.cores / one_worker],
            [f"{args.cores} workers x 1 thread", args.cores, many_workers,
             sum(many_rates) / len(many_rates), 3600 * args.cores / many_workers],
        ],
    )  # fmt: skip
    print_json(
        {
            "benchmark": "sweep_workers",
            "cores": args.cores,
            "steps": args.steps,
            "one_worker_s": one_worker,
            "many_workers_s": many_workers,
            "one_worker_tokens_per_sec": one_rates,
            "many_workers_tokens_per_sec": many_rates,
            "speedup_many_over_one": one_worker / many_workers,
        }
    )


if __name__ == "__main__":
    main()
