"""Sweep worker layout: on a small CPU machine, do N workers of one thread each finish trials
faster than one worker with N threads? And trials per hour of the product's own launcher.

    python -m benchmarks.sweep_workers [--cores 2] [--steps 200] [overrides]
    python -m benchmarks.sweep_workers --through-sweep 1 2 4 [--spec ablations/smoke.yaml]

`--through-sweep N...` runs the study of `--spec` once per N with
`python -m pipeline.sweep SPEC --workers N [--n-trials K]` (fresh SQLite storage, results and
work folders in a temp dir; each worker gets cores / N threads, CUDA MPS on a GPU where
installed) and reports its wall time and finished trials per hour: the number that picks
`--workers`. `--n-trials K` stops each worker after K trials, so every N runs K trials per
worker from one grid of at least K x max(N) points. On a GPU it samples the card's utilisation
and memory through NVML while each study runs. `--out` gets the JSON after every N.

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import base_parser, print_json, print_table
from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.atomic import write_json_atomic
from pipeline.environment import provenance
from pipeline.metric_names import MEAN_TOKENS_PER_SEC
from pipeline.sweep.launch import MPS_CONTROL

CHILD_FLAG = "--child"
GPU_SAMPLE_INTERVAL_S = 0.5  # NVML's utilisation is itself an average over ~1/6 to 1 s


def _config(overrides: list[str], steps: int, work: Path) -> config_schema.Config:
    paths = {"prepared": "data/prepared", "tokenized": "data/tokenized", "train_dir": "train",
             "metrics_dir": "metrics", "plots_dir": "plots", "wandb_dir": "wandb"}  # fmt: skip
    return config_lib.compose([
        "experiment=multi30k_tiny", *overrides, f"train.max_steps={steps}",
        f"train.val_check_interval={steps}", "train.progress_bar=false",
        "logger.wandb.mode=disabled", *(f"paths.{key}={work / value}" for key, value in paths.items()),
    ])  # fmt: skip


def _child(overrides: list[str], steps: int, work: Path) -> None:
    from pipeline.training import trainer

    summary = trainer.run(_config(overrides, steps, work))
    print(json.dumps({"tokens_per_sec": summary[MEAN_TOKENS_PER_SEC]}))


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


class GpuSampler:
    """The GPU's utilisation and memory in use, read through NVML every `interval_s` in a
    background thread while a study runs (`with GpuSampler() as gpu: ...; gpu.summary()`).
    Without NVML or a GPU it samples nothing and its summary says why."""

    def __init__(self, interval_s: float = GPU_SAMPLE_INTERVAL_S) -> None:
        self.interval_s, self.samples, self.unavailable = interval_s, [], None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as error:  # no NVML library, no driver, no GPU
            self.unavailable = f"no GPU to sample through NVML: {error!r}"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.samples.append((rates.gpu, memory.used))

    def __enter__(self) -> GpuSampler:
        if self.unavailable is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        if self.unavailable is not None:
            return {"unavailable": self.unavailable}
        utilisation = [u for u, _ in self.samples]
        return {
            "samples": len(self.samples),
            "interval_s": self.interval_s,
            "utilisation_mean_percent": statistics.fmean(utilisation) if utilisation else None,
            "utilisation_median_percent": statistics.median(utilisation) if utilisation else None,
            "memory_used_max_bytes": max((m for _, m in self.samples), default=None),
        }


def trials_per_hour(spec: str, workers: list[int], n_trials: int | None = None,
                    on_row=None) -> list[dict]:  # fmt: skip
    """The study of `spec` run once per number of workers through the sweep CLI: to its end,
    or `n_trials` trials per worker. `on_row(rows)` is called after every N."""
    import optuna

    from pipeline.sweep import FINISHED, load_spec

    study = load_spec(spec).study
    rows = []
    for n in workers:
        with tempfile.TemporaryDirectory(prefix=f"sweep-{n}-workers-") as tmp:
            results, work = Path(tmp) / "results", Path(tmp) / "work"
            command = [sys.executable, "-m", "pipeline.sweep", spec, "--workers", str(n),
                       "--results-dir", str(results), "--work-dir", str(work)]  # fmt: skip
            if n_trials is not None:
                command += ["--n-trials", str(n_trials)]
            env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
            started = time.perf_counter()
            with GpuSampler() as gpu:
                subprocess.run(command, env=env, check=True)
            seconds = time.perf_counter() - started
            storage = f"sqlite:///{results / study / 'study.db'}"
            trials = optuna.load_study(study_name=study, storage=storage).get_trials(
                deepcopy=False, states=FINISHED
            )
        rows.append({"workers": n, "trials": len(trials), "wall_s": seconds,
                     "trials_per_hour": 3600 * len(trials) / seconds,
                     "gpu": gpu.summary()})  # fmt: skip
        if on_row is not None:
            on_row(rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument("--through-sweep", type=int, nargs="+", metavar="N", default=None,
                        help="trials/hour of `pipeline.sweep --spec --workers N` for each N")  # fmt: skip
    parser.add_argument("--spec", default="ablations/smoke.yaml")
    parser.add_argument("--n-trials", type=int, default=None,
                        help="--through-sweep: trials per worker (default: the whole grid)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="--through-sweep: write the JSON here after every N")  # fmt: skip
    parser.add_argument(CHILD_FLAG, type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.overrides, args.steps, args.child)
        return
    if args.through_sweep:
        import torch

        header = {"benchmark": "sweep_workers", "spec": args.spec, "n_trials": args.n_trials,
                  "provenance": provenance(), "torch": torch.__version__,
                  "cuda": torch.version.cuda,
                  "mps_control": shutil.which(MPS_CONTROL) is not None}  # fmt: skip

        def write(rows: list[dict]) -> None:
            if args.out is not None:
                write_json_atomic(args.out, {**header, "through_sweep": rows}, sort_keys=True)

        rows = trials_per_hour(args.spec, args.through_sweep, args.n_trials, on_row=write)
        print_table(["workers", "trials", "wall time (s)", "trials per hour"],
                    [[r["workers"], r["trials"], r["wall_s"], r["trials_per_hour"]] for r in rows])  # fmt: skip
        print_json({**header, "through_sweep": rows})
        return
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize

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
        procs = [_launch(args.overrides, args.steps, work_dir("many", run), 1)
                 for run in range(args.cores)]  # fmt: skip
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
    print_json({"benchmark": "sweep_workers", "cores": args.cores, "steps": args.steps,
                "one_worker_s": one_worker, "many_workers_s": many_workers,
                "one_worker_tokens_per_sec": one_rates, "many_workers_tokens_per_sec": many_rates,
                "speedup_many_over_one": one_worker / many_workers})  # fmt: skip


if __name__ == "__main__":
    main()
