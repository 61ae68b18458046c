"""The Makefile: `make help` names every target, and a set-up that failed is redone by the
next make (run on a copy of the Makefile with a stand-in Python whose pip can be made to fail,
so the real .venv is never touched)."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

from pipeline import environment
from tests.conftest import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"

# `python -m venv DIR` writes DIR/bin/activate and a pip that logs each call and fails while
# the file `pip-fails` exists beside the Makefile.
STAND_IN_PYTHON = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 1
mkdir -p "$3/bin"
touch "$3/bin/activate"
cat > "$3/bin/pip" <<'PIP'
#!/bin/sh
echo "$*" >> pip.log
[ ! -e pip-fails ]
PIP
chmod +x "$3/bin/pip"
"""


def make(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def phony_targets() -> list[str]:
    line = re.search(r"^\.PHONY:(.*)$", MAKEFILE.read_text(encoding="utf-8"), re.M)
    return line.group(1).split()


def test_make_help_lists_every_target_with_a_line_saying_what_it_does():
    result = make("help", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    described = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert sorted(described) == sorted(phony_targets())
    assert all(text.strip() for text in described.values())


def test_a_setup_whose_install_failed_is_redone_by_the_next_make(tmp_path):
    shutil.copyfile(MAKEFILE, tmp_path / "Makefile")
    python = tmp_path / "python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "pip-fails").touch()

    failed = make("setup", f"PYTHON={python}", cwd=tmp_path)
    assert failed.returncode != 0
    assert (tmp_path / ".venv" / "bin" / "activate").exists()  # the venv is there, half-built
    (tmp_path / "pip-fails").unlink()
    (tmp_path / "pip.log").unlink()

    redone = make("setup", f"PYTHON={python}", cwd=tmp_path)
    assert redone.returncode == 0, redone.stderr
    installs = (tmp_path / "pip.log").read_text().splitlines()
    assert len(installs) == 4 and installs[-2].endswith("-e .[dev,export,docs]")
    assert "--target .venv/peers transformers " in installs[-1]  # the lab's peer, beside it
    (tmp_path / "pip.log").unlink()

    again = make("setup", f"PYTHON={python}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not (tmp_path / "pip.log").exists()  # done once it succeeded: nothing installed again


def test_make_lock_resolves_every_extra_the_lock_must_pin():
    """`make lock` installs the environment's extras and the peers' together, so the lock pins
    what `make setup` puts beside the environment too (`make -n`: printed, not run)."""
    result = make("-n", "lock", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    (extras,) = re.findall(r'-e "\.\[([^\]]+)\]"', result.stdout)
    assert set(environment.LOCKED_EXTRAS) <= set(extras.split(","))
