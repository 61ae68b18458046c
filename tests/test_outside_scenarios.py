"""The outside tester's reliability scenarios (tests/outside_scenarios.py), run as a script as
they were: every one ends with exit 2 naming the key, file or URL, and changes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_every_outside_scenario_holds(multi30k_dir):
    import os

    from tests.outside_scenarios import SCENARIOS

    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "outside_scenarios.py")],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
        env={**os.environ, "MULTI30K_DIR": str(multi30k_dir)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    held = [line for line in done.stdout.splitlines() if line.startswith("held ")]
    assert len(held) == len(SCENARIOS) >= 20, done.stdout
    assert done.stdout.rstrip().endswith(f"{len(SCENARIOS)} of {len(SCENARIOS)} scenarios held")
