"""pipeline.console: a long phase is a bar in a terminal and one line in a log, and a warning is
one line, through a pipe and through a pseudo-terminal (Python's `pty`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT, run_in_terminal

# A command through `pipeline.cli.main`, as every stage and tool runs: a phase, then a warning.
COMMAND = [sys.executable, "-c", """
import warnings
from pipeline import console
from pipeline.cli import main

def run():
    with console.Phase("encode train", total=3, unit="sent") as phase:
        for _ in range(3):
            phase.update()
    warnings.warn("3 training pairs dropped: over the limit")

main(run)
"""]  # fmt: skip


def test_without_a_terminal_a_phase_and_a_warning_are_one_line_each():
    result = subprocess.run(COMMAND, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr  # no bar frames in a log
    assert re.fullmatch(
        r"encode train: 3 sent in 0:00:0\d\nwarning: 3 training pairs dropped: over the limit\n",
        result.stderr,
    ), result.stderr


def test_in_a_terminal_a_phase_draws_a_bar_and_a_warning_has_no_source_line():
    out = run_in_terminal(COMMAND, REPO_ROOT, dict(os.environ), timeout=120)
    assert re.search(r"encode train: 100%\|[^|]*\| 3/3 ", out), out
    assert "\nwarning: 3 training pairs dropped: over the limit\r\n" in out, out
    for noise in ("UserWarning", "warnings.warn(", "<string>:"):  # category, code line, path
        assert noise not in out, noise
