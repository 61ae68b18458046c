"""Several sweep workers on one machine: `python -m pipeline.sweep <spec> --workers N`.

The launcher starts N ordinary workers (`python -m pipeline.sweep <spec>` with the same
storage, results and work directories) and waits for them. They share the study through its
storage exactly as workers on separate machines do: each claims WAITING grid points (or asks
the search sampler) one at a time, so every point runs once, and a worker that dies leaves a
stale heartbeat that the others retry.

Sharing the machine:
- CPU: each worker gets `cores // N` intra-op threads (at least one), through OMP_NUM_THREADS
  and MKL_NUM_THREADS, so that N workers do not oversubscribe the cores that torch would
  otherwise give each of them in full.
- GPU: the workers share the one visible device. Where NVIDIA's Multi-Process Service is
  installed (`nvidia-cuda-mps-control` on PATH), the launcher starts a private MPS daemon for
  its workers (its pipe and log folders in a temporary folder) and stops it at the end, or
  lets the workers use a daemon that already serves (its control pipe exists): the small kernels of several processes then run
  side by side instead of taking turns. Without it, the driver time-slices the processes.
- SIGTERM/SIGUSR1 to the launcher is passed on to every worker: each saves its trial's
  checkpoint and queues the point again, as a single worker does. Ctrl-C reaches the workers
  from the terminal itself; the launcher then waits for them to stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_MPS_PIPE = "/tmp/nvidia-mps"  # where a system-wide daemon listens unless told otherwise
THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
WORKER_ENV = "PIPELINE_SWEEP_WORKER"  # "i/N": which of the launcher's workers a process is
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's or a SLURM
    job's share), not every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    return max(1, (cores or usable_cores()) // workers)


def uses_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@contextmanager
def mps_daemon(enabled: bool) -> Iterator[dict[str, str]]:
    """A private MPS control daemon while the workers run; yields the environment that points
    the workers' CUDA at it (empty where MPS is off or not installed)."""
    control = shutil.which(MPS_CONTROL) if enabled else None
    serving = Path(os.environ.get(MPS_PIPE_ENV, DEFAULT_MPS_PIPE)) / "control"
    if control is not None and serving.exists():
        log.info("an MPS daemon already serves this GPU (%s): the workers use it", serving)
        yield {}
        return
    if control is None:
        if enabled:
            log.info("%s not found: the workers time-share the GPU", MPS_CONTROL)
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="sweep-mps-") as folder:
        env = {MPS_PIPE_ENV: str(Path(folder) / "pipe"), MPS_LOG_ENV: str(Path(folder) / "log")}
        for path in env.values():
            Path(path).mkdir()
        started = subprocess.run([control, "-d"], env={**os.environ, **env},
                                 capture_output=True, text=True)  # fmt: skip
        if started.returncode != 0:
            log.warning("MPS daemon did not start (%s): the workers time-share the GPU",
                        (started.stderr or started.stdout).strip())  # fmt: skip
            yield {}
            return
        log.info("MPS daemon started for the workers (pipe %s)", env[MPS_PIPE_ENV])
        try:
            yield env
        finally:
            subprocess.run([control], input="quit\n", env={**os.environ, **env},
                           capture_output=True, text=True)  # fmt: skip


def worker_command(spec: str, storage: str, results_dir: Path, work_dir: Path,
                   n_trials: int | None, flags: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """One ordinary worker's command line (the single-worker CLI, without --workers)."""
    command = [sys.executable, "-m", "pipeline.sweep", spec, "--storage", storage,
               "--results-dir", str(results_dir), "--work-dir", str(work_dir)]  # fmt: skip
    if n_trials is not None:
        command += ["--n-trials", str(n_trials)]
    return command + list(flags)


def launch_workers(command: Sequence[str], workers: int, cores: int | None = None,
                   mps: bool | None = None) -> int:  # fmt: skip
    """Run `workers` copies of `command` side by side; returns 0 when every one succeeded,
    else the first non-zero exit status. `mps`: None starts MPS where CUDA is in use."""
    threads = threads_per_worker(workers, cores)
    use_mps = uses_cuda() if mps is None else mps
    with mps_daemon(use_mps and workers > 1) as mps_env:
        log.info("starting %d sweep workers, %d thread(s) each%s", workers, threads,
                 " under MPS" if mps_env else "")  # fmt: skip
        processes = []
        for index in range(workers):
            env = {**os.environ, **mps_env, WORKER_ENV: f"{index + 1}/{workers}"}
            env.update(dict.fromkeys(THREAD_ENVS, str(threads)))
            processes.append(subprocess.Popen(list(command), env=env))
        with forwarded_signals(processes):
            codes = [process.wait() for process in processes]
    failed = [code for code in codes if code != 0]
    if failed:
        log.error("%d of %d workers failed (exit %s)", len(failed), workers, failed)
    return failed[0] if failed else 0


@contextmanager
def forwarded_signals(processes: Sequence[subprocess.Popen]) -> Iterator[None]:
    """Pass a stop signal on to every worker (each stops at a checkpoint and requeues its
    point) instead of leaving them to run on without their launcher."""

    def forward(signum, _frame) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    # Ctrl-C: the terminal signals the workers' process group already; wait for them to stop
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
