"""The suite's own bounds: every test has a deadline, and no helper waits on a daemon's output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO_ROOT, run_in_terminal

DAEMON_SECONDS = 300  # how long the daemon in these tests would hold its output open


def test_every_test_has_a_deadline(pytestconfig):
    assert float(pytestconfig.getini("timeout")) > 0
    assert pytestconfig.getini("timeout_method") == "signal"


def test_a_hanging_test_fails_alone_with_its_traceback(tmp_path: Path):
    """A test that waits on a pipe a daemon holds open is stopped at the deadline, named with
    where it waited, and the run goes on to the next test."""
    (tmp_path / "test_hang.py").write_text(
        "import subprocess\n"
        "def test_waits_on_a_daemon():\n"
        f"    subprocess.run(['sh', '-c', 'sleep {DAEMON_SECONDS} & echo started'],\n"
        "                   capture_output=True)\n"
        "def test_after():\n"
        "    pass\n"
    )
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=5",
         "-o", "timeout_method=signal", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=DAEMON_SECONDS - 60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert time.monotonic() - started < DAEMON_SECONDS - 60
    assert run.returncode == 1, run.stdout
    assert "Timeout" in run.stdout and "test_waits_on_a_daemon" in run.stdout
    assert "1 failed, 1 passed" in run.stdout


def test_a_terminal_left_open_by_a_daemon_ends_with_its_command():
    """`run_in_terminal` returns when its command exits, though a daemon it started still holds
    the terminal."""
    command = ["sh", "-c", f"sleep {DAEMON_SECONDS} & echo started"]
    started = time.monotonic()
    output = run_in_terminal(command, cwd=REPO_ROOT, env=dict(os.environ), timeout=60)
    assert "started" in output
    assert time.monotonic() - started < 60
