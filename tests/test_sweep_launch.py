"""`python -m pipeline.sweep <spec> --workers N`: N workers on one machine sharing a study
through its real SQLite storage; threads per worker, the MPS daemon, signals, exit status."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pipeline.sweep import launch
from tests.conftest import REPO_ROOT

# A stand-in worker: records its environment, then runs until told to stop or for `seconds`.
WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out, seconds, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    def stop(signum, frame):
        open(f"{out}.{os.getpid()}.stopped", "w").write(str(signum))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PIPELINE_SWEEP_WORKER",
            "CUDA_MPS_PIPE_DIRECTORY")
    open(f"{out}.{os.getpid()}.json", "w").write(json.dumps({k: os.environ.get(k) for k in keys}))
    time.sleep(seconds)
    sys.exit(code)
    """
)


def worker(tmp_path: Path, seconds: float = 0.0, code: int = 0) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, str(script), str(tmp_path / "w"), str(seconds), str(code)]


def recorded(tmp_path: Path, suffix: str) -> list[str]:
    return [p.read_text() for p in sorted(tmp_path.glob(f"w.*.{suffix}"))]


def test_threads_per_worker_split_the_cores():
    assert launch.threads_per_worker(2, cores=16) == 8
    assert launch.threads_per_worker(3, cores=16) == 5
    assert launch.threads_per_worker(4, cores=2) == 1  # never zero


def test_each_worker_gets_its_share_of_the_cores_and_its_number(tmp_path):
    assert launch.launch_workers(worker(tmp_path), 3, cores=7, mps=False) == 0
    envs = [json.loads(text) for text in recorded(tmp_path, "json")]
    assert len(envs) == 3
    assert {e["OMP_NUM_THREADS"] for e in envs} == {e["MKL_NUM_THREADS"] for e in envs} == {"2"}
    assert sorted(e["PIPELINE_SWEEP_WORKER"] for e in envs) == ["1/3", "2/3", "3/3"]
    assert all(e["CUDA_MPS_PIPE_DIRECTORY"] is None for e in envs)


def test_a_failing_worker_fails_the_launch(tmp_path):
    assert launch.launch_workers(worker(tmp_path, code=3), 2, cores=2, mps=False) == 3


def test_sigterm_to_the_launcher_reaches_every_worker(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pipeline.sweep import launch; "
         f"sys.exit(launch.launch_workers({worker(tmp_path, seconds=120)!r}, 2, 2, False))"],
        cwd=REPO_ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(recorded(tmp_path, "json")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 0  # the workers stopped cleanly on the signal
    assert recorded(tmp_path, "stopped") == [str(int(signal.SIGTERM))] * 2


def stand_in_mps_control(tmp_path: Path, monkeypatch, command: str) -> None:
    """A `nvidia-cuda-mps-control` first on PATH that runs `command` (this machine has no GPU)."""
    control = tmp_path / "bin" / launch.MPS_CONTROL
    control.parent.mkdir()
    control.write_text(f"#!/bin/sh\n{command}\n")
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{control.parent}{os.pathsep}{os.environ['PATH']}")


def test_workers_share_a_private_mps_daemon_where_it_is_installed(tmp_path, monkeypatch):
    # a stand-in `nvidia-cuda-mps-control` records how it is called
    stand_in_mps_control(
        tmp_path, monkeypatch, f'echo "$* $(cat) $CUDA_MPS_PIPE_DIRECTORY" >>{tmp_path}/mps'
    )
    assert launch.launch_workers(worker(tmp_path), 2, cores=2, mps=True) == 0
    start, stop = (tmp_path / "mps").read_text().splitlines()
    pipe = start.split()[-1]
    assert start.startswith("-d") and stop.split() == ["quit", pipe]
    assert {json.loads(t)["CUDA_MPS_PIPE_DIRECTORY"] for t in recorded(tmp_path, "json")} == {pipe}
    assert not Path(pipe).exists()  # its folder is removed afterwards


def test_a_running_mps_daemon_is_used_and_left_alone(tmp_path, monkeypatch):
    stand_in_mps_control(tmp_path, monkeypatch, f"echo called >>{tmp_path}/mps")
    pipe = tmp_path / "system-mps"
    pipe.mkdir()
    (pipe / "control").touch()  # where a running daemon listens
    monkeypatch.setenv(launch.MPS_PIPE_ENV, str(pipe))
    assert launch.launch_workers(worker(tmp_path), 2, cores=2, mps=True) == 0
    assert not (tmp_path / "mps").exists()  # neither started nor stopped
    assert {json.loads(t)["CUDA_MPS_PIPE_DIRECTORY"] for t in recorded(tmp_path, "json")} == {
        str(pipe)
    }


def test_without_mps_installed_the_workers_time_share(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert launch.launch_workers(worker(tmp_path), 2, cores=2, mps=True) == 0
    assert all(json.loads(t)["CUDA_MPS_PIPE_DIRECTORY"] is None
               for t in recorded(tmp_path, "json"))  # fmt: skip


def test_workers_below_one_are_refused():
    result = subprocess.run([sys.executable, "-m", "pipeline.sweep", "ablations/smoke.yaml",
                             "--workers", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2 and "--workers must be >= 1, got 0" in result.stderr
