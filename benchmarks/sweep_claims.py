"""Sweep coordination at scale: N workers (the sweep's own `run_worker`, a trial that sleeps
0-`--sleep-ms` ms instead of training) against one PostgreSQL storage, for a grid of G points.

    python -m benchmarks.sweep_claims [--workers 4 16 32] [--points 500 5000]
        [--trials-per-worker 10] [--storage postgresql://postgres@127.0.0.1:5432/test]

For each G: a fresh study of G points (2 variants x G/2 seeds); then for each N (those with
N x `--trials-per-worker` < G) N worker processes that start claiming together and stop after
`--trials-per-worker` trials each, on what the study has left waiting (so G = 5000 measures
claims among ~5000 waiting trials without running them all); then the study is deleted. It
reports
  claims/s            trials claimed per second by all workers together
  coordinator ms      per trial, a worker's time between one trial's end and the next one's
                      start (tell, stale-trial scans, counts, the claim, the trial's start):
                      median and 95th percentile over every gap of every worker; and the
                      median of the worker process's CPU time in those gaps (on a machine
                      with fewer cores than workers, the wall time is mostly waiting for one)
  claim queries       claim transactions per claimed trial (retries first, then fresh points)
  connections         the server's connections from the workers (pg_stat_activity, by
                      application_name), sampled every CONNECTION_SAMPLE_S: the most, and the
                      median, while the workers ran
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml

CHILD_FLAG = "--child"
APPLICATION_NAME = "sweep-claims-benchmark"  # how the server tells the workers' connections
CONNECTION_SAMPLE_S = 0.05
READY_TIMEOUT_S = 600  # N workers importing the pipeline on a busy machine
RUN_TIMEOUT_S = 1800
DEFAULT_STORAGE = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def write_spec(folder: Path, points: int) -> Path:
    """A grid of `points` points: two variants (each composed once when a worker loads the
    spec) times points / 2 seeds."""
    spec = {
        "study": f"claims_bench_{uuid.uuid4().hex[:8]}",
        "kind": "grid",
        "base_experiment": "smoke",
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": list(range(1, points // 2 + 1)),
        "variants": {"heads_1": {"model.heads": 1}, "heads_2": {"model.heads": 2}},
        "settings": {"max_grid_points": points, "poll_interval": 0.2},
    }
    path = folder / f"{spec['study']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def with_application_name(url: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={APPLICATION_NAME}"


def _child(spec_path: str, url: str, trials: int, sleep_ms: float, out: str, go: str) -> None:
    """One worker: ready, wait for `go`, run `trials` trials, write its timings to `out`."""
    from pipeline import sweep
    from pipeline.sweep import claims

    spec = sweep.load_spec(spec_path, allow_large_grid=True)
    pages = []
    claim_from_page = claims.claim_from_page

    def counted(*args, **kwargs):
        pages.append(1)
        return claim_from_page(*args, **kwargs)

    claims.claim_from_page = counted  # counts the claim transactions of this worker
    spans: list[tuple[float, float, float, float]] = []  # wall and CPU time at start, end

    def trial_fn(spec, trial, results_root) -> float:
        started, cpu = time.perf_counter(), time.process_time()
        time.sleep(random.uniform(0, sleep_ms) / 1000)
        spans.append((started, time.perf_counter(), cpu, time.process_time()))
        return 0.0

    Path(out + ".ready").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    with tempfile.TemporaryDirectory() as results:
        # The tree may change while a benchmark runs (a dirty checkout): no pin to hold to.
        sweep.run_worker(
            spec, url, Path(results), n_trials=trials, trial_fn=trial_fn, allow_mixed=True
        )
    Path(out).write_text(json.dumps({"spans": spans, "claim_queries": len(pages)}))


def _sample_connections(url: str, stop: threading.Event, samples: list[int]) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    query = sqlalchemy.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n")
    with engine.connect() as connection:
        while not stop.wait(CONNECTION_SAMPLE_S):
            samples.append(connection.execute(query, {"n": APPLICATION_NAME}).scalar())
            connection.commit()  # a fresh snapshot of pg_stat_activity for the next sample
    engine.dispose()


def run_study(url: str, points: int, workers: list[int], trials: int, sleep_ms: float,
              on_row: Callable[[dict], None]) -> None:  # fmt: skip
    """One study of `points` points, then each N of `workers` in turn on what it has left
    waiting; `on_row(row)` after each N. The study is deleted at the end."""
    import optuna

    from pipeline import sweep
    from pipeline.sweep import pin

    with tempfile.TemporaryDirectory(prefix="sweep-claims-") as tmp:
        folder = Path(tmp)
        spec_path = write_spec(folder, points)
        spec = sweep.load_spec(spec_path, allow_large_grid=True)
        started = time.perf_counter()
        # Created through a pooled storage: enqueueing G points is one transaction each, and
        # what is measured here is the workers, not the study's creation.
        sweep.open_study(spec, optuna.storages.RDBStorage(url), pin=lambda: pin.this_worker(spec))
        enqueue_s = time.perf_counter() - started
        try:
            for n in workers:
                row = run_workers(folder / f"{n}-workers", spec_path, url, n, trials, sleep_ms)
                on_row({"points": points, "enqueue_s": enqueue_s, **row})
        finally:
            optuna.delete_study(study_name=spec.study, storage=url)


def run_workers(folder: Path, spec_path: Path, url: str, workers: int, trials: int,
                sleep_ms: float) -> dict:  # fmt: skip
    """N workers started together on the study, `trials` trials each."""
    import optuna

    from pipeline import sweep

    spec = sweep.load_spec(spec_path, allow_large_grid=True)
    study = optuna.load_study(study_name=spec.study, storage=url)
    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    folder.mkdir()
    go = folder / "go"
    outs = [folder / f"worker-{i}.json" for i in range(workers)]
    command = [sys.executable, "-m", "benchmarks.sweep_claims", CHILD_FLAG, str(spec_path),
               with_application_name(url), str(trials), str(sleep_ms)]  # fmt: skip
    procs = [subprocess.Popen([*command, str(out), str(go)]) for out in outs]
    samples: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_connections, args=(url, stop, samples), daemon=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(Path(f"{out}.ready").exists() for out in outs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit("a benchmark worker did not start")
            time.sleep(0.1)
        sampler.start()
        go.touch()
        for proc in procs:
            if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
                raise SystemExit(f"a benchmark worker failed (exit {proc.returncode})")
    finally:
        stop.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    sampler.join()
    results = [json.loads(out.read_text()) for out in outs]
    spans = [span for result in results for span in result["spans"]]
    pairs = [(before, after) for result in results
             for before, after in zip(result["spans"], result["spans"][1:])]  # fmt: skip
    gaps = [after[0] - before[1] for before, after in pairs]
    cpu_gaps = [after[2] - before[3] for before, after in pairs]
    claimed = len(spans)
    wall = max(span[1] for span in spans) - min(span[0] for span in spans)
    return {
        "workers": workers,
        "waiting_at_start": waiting,
        "trials": claimed,
        "claims_per_s": claimed / wall,
        "coordinator_ms_median": 1000 * statistics.median(gaps),
        "coordinator_ms_p95": 1000 * statistics.quantiles(gaps, n=20)[-1],
        "coordinator_cpu_ms_median": 1000 * statistics.median(cpu_gaps),
        "claim_queries_per_claim": sum(r["claim_queries"] for r in results) / claimed,
        "connections_max": max(samples),
        "connections_median": statistics.median(samples),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:
        spec_path, url, trials, sleep_ms, out, go = argv[1:]
        _child(spec_path, url, int(trials), float(sleep_ms), out, go)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--trials-per-worker", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=50.0, help="a trial's longest sleep")
    parser.add_argument("--storage", default=DEFAULT_STORAGE)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    from benchmarks.common import print_json, print_table
    from pipeline.atomic import write_json_atomic
    from pipeline.environment import provenance

    rows: list[dict] = []
    payload = {"benchmark": "sweep_claims", "trials_per_worker": args.trials_per_worker,
               "sleep_ms": args.sleep_ms, "provenance": provenance(), "rows": rows}  # fmt: skip

    def on_row(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out is not None:  # after every row: a long run stopped early keeps its rows
            write_json_atomic(args.out, payload, sort_keys=True)

    for points in args.points:
        workers = [n for n in args.workers if n * args.trials_per_worker < points]
        run_study(args.storage, points, workers, args.trials_per_worker, args.sleep_ms, on_row)
    print_table(
        ["workers", "points", "waiting", "claims/s", "coordinator ms (median)", "(p95)", "(CPU)",
         "claim queries/claim", "connections (max)", "(median)"],
        [[r["workers"], r["points"], r["waiting_at_start"], r["claims_per_s"], r["coordinator_ms_median"],
          r["coordinator_ms_p95"], r["coordinator_cpu_ms_median"], r["claim_queries_per_claim"], r["connections_max"],
          r["connections_median"]] for r in rows],
    )  # fmt: skip
    print_json(payload)


if __name__ == "__main__":
    main()
