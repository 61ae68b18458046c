"""benchmarks/ci_run.py: a fresh clone's CI script run and recorded, on real git clones running
a real pytest, and the docs table of the committed records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ci_run, machine_records
from pipeline import docs_blocks, environment
from tests.conftest import REPO_ROOT

OUTCOMES_TESTS = """
import time

import pytest

@pytest.fixture
def broken():
    raise RuntimeError("set-up fails")

def test_one(): time.sleep(0.3)
def test_two(): pass
def test_three(): assert 1 == 2
def test_four(broken): pass

@pytest.mark.skip(reason="skipped on purpose")
def test_five(): pass
"""


# spins until the process has used one second of CPU (iter(int, 1) never ends by itself)
BUSY_FOR_ONE_CPU_SECOND = "import time; any(time.process_time() >= 1.0 for _ in iter(int, 1))"


def git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    return subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True,
                          text=True, timeout=300).stdout.strip()  # fmt: skip


def small_repository(root: Path, ci_commands: str, makefile: str | None = None) -> Path:
    """A git repository beside `root/shared` whose CI script runs `ci_commands` (with a
    Makefile of `makefile`'s text, if given)."""
    (root / ci_run.SHARED).mkdir(parents=True)
    repo = root / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / ci_run.CI_SCRIPT).write_text(
        f'#!/usr/bin/env bash\nset -euo pipefail\ncd "$(dirname "$0")/.."\n'
        f"test -d ../{ci_run.SHARED}\n{ci_commands}\n"
    )
    (repo / "test_outcomes.py").write_text(OUTCOMES_TESTS)
    (repo / "requirements.lock").write_text("packaging==24.2\n")
    if makefile is not None:
        (repo / "Makefile").write_text(makefile)
    git("init", "--quiet", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "small", cwd=repo)
    return repo


@pytest.fixture
def outer_pytest_settings_removed(monkeypatch):
    """The suite's own pytest options (a --basetemp, say) and pytest workers (TEST_WORKERS, set
    when this suite itself runs under `ci_run --test-workers`) are not the small repository's."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("TEST_WORKERS", raising=False)


@pytest.mark.parametrize("verbosity", ["-q", "-v"])
def test_a_clones_ci_run_is_recorded_with_its_counts_times_commit_and_machine(
    tmp_path, capsys, outer_pytest_settings_removed, verbosity
):
    # a second of CPU, a second of waiting, then pytest listing its two slowest tests
    busy = f"{sys.executable} -c {BUSY_FOR_ONE_CPU_SECOND!r}"
    pytest_command = (f"{sys.executable} -m pytest {verbosity} -p no:cacheprovider "
                      "--durations=2 --durations-min=0 test_outcomes.py")  # fmt: skip
    repo = small_repository(tmp_path, f"{busy}\nsleep 1\n{pytest_command}")
    clone, results = tmp_path / "clone", tmp_path / "results"

    code = ci_run.main(["--repo", str(repo), "--clone-into", str(clone), "--results", str(results)])

    assert code == 1  # pytest's: one test failed
    assert not clone.exists()  # removed after the run
    log = clone.with_name("clone.log").read_text()
    assert "1 failed, 2 passed, 1 skipped, 1 error" in log
    assert log in capsys.readouterr().out  # shown as it came
    (path,) = results.glob("*.json")
    entry = json.loads(path.read_text())
    assert entry["tests"] == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}
    assert 0 < entry["pytest_s"] <= entry["total_s"]
    assert entry["cores"] == os.cpu_count()
    assert 1.0 <= entry["cpu_s"] < entry["total_s"] * entry["cores"]  # the sleep used no CPU
    slowest = entry["slowest"][0]
    assert (slowest["test"], slowest["phase"]) == ("test_outcomes.py::test_one", "call")
    assert slowest["seconds"] >= 0.3
    assert len(entry["slowest"]) == 2
    # every test of the file, skipped and errored ones too, from the JUnit report it was asked for
    (by_file,) = entry["by_file"]
    assert (by_file["file"], by_file["tests"]) == ("test_outcomes.py", 5)
    assert slowest["seconds"] <= by_file["seconds"] <= entry["pytest_s"]
    assert clone.with_name("clone.junit.xml").is_file()  # kept beside the log
    assert entry["exit_code"] == 1
    assert entry["provenance"] == {
        "commit": git("rev-parse", "--short", "HEAD", cwd=repo),
        "environment_lock": environment.lock_hash(repo / "requirements.lock"),
        "hardware": environment.hardware(),
    }
    cpu = environment.cpuinfo()
    assert entry["cpu"] == {"family": cpu.get("cpu family"), "model": cpu.get("model")}
    assert path.name == machine_records.record_name(entry)

    assert ci_run.main(["report", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "| failed (exit 1) | 2 passed, 1 failed, 1 errors, 1 skipped |" in table
    assert f"| {entry['provenance']['commit']} |" in table
    assert f"(family {cpu.get('cpu family')}, model {cpu.get('model')}) | failed" in table
    assert f"| {ci_run.cores_busy(entry)} |" in table
    assert "| call | `test_outcomes.py::test_one` |" in table
    assert f"| `test_outcomes.py` | 5 | {by_file['seconds']:.0f} | 100% |" in table


def test_a_run_that_stops_before_pytest_is_recorded_with_no_tests(
    tmp_path, outer_pytest_settings_removed
):
    repo = small_repository(tmp_path, "echo 'lint: 1 error'; exit 3")
    results = tmp_path / "results"
    argv = ["--repo", str(repo), "--clone-into", str(tmp_path / "clone"), "--results", str(results)]

    assert ci_run.main(argv) == 3
    (path,) = results.glob("*.json")
    entry = json.loads(path.read_text())
    assert (entry["tests"], entry["pytest_s"], entry["exit_code"]) == (None, None, 3)
    assert "| failed (exit 3) | none ran | - / " in ci_run.block([entry])
    assert entry["slowest"] == [] and "Where the time goes" not in ci_run.block([entry])
    assert entry["by_file"] is None
    assert entry["test_workers"] is None  # no Makefile, no TEST_WORKERS


def test_the_pytest_workers_asked_for_reach_the_ci_script_and_are_recorded(
    tmp_path, capsys, outer_pytest_settings_removed
):
    repo = small_repository(tmp_path, 'echo "TEST_WORKERS=${TEST_WORKERS:-unset}"',
                            makefile="lint:\n\ttrue\nTEST_WORKERS ?= 2\n")  # fmt: skip
    results = tmp_path / "results"
    for asked, seen in [([], "unset"), (["--test-workers", "3"], "3")]:
        clone = tmp_path / f"clone-{seen}"
        argv = ["--repo", str(repo), "--clone-into", str(clone), "--results", str(results)]
        assert ci_run.main([*argv, *asked]) == 0
        assert f"TEST_WORKERS={seen}" in clone.with_name(clone.name + ".log").read_text()
    entries = machine_records.load(results)  # one day, commit and class: both records kept
    assert [e["test_workers"] for e in entries] == [2, 3]  # the Makefile's default, then asked
    assert [ci_run.row(e)[ci_run.HEADER.index("workers")] for e in entries] == ["2", "3"]

    with pytest.raises(SystemExit):
        ci_run.main(["--repo", str(repo), "--test-workers", "0"])
    assert "--test-workers 0: at least 1" in capsys.readouterr().err


def test_a_test_case_is_counted_in_the_file_its_class_name_comes_from(tmp_path):
    (tmp_path / "tests" / "lab").mkdir(parents=True)
    for name in ("tests/test_a.py", "tests/lab/test_b.py"):
        (tmp_path / name).write_text("")
    junit = tmp_path / "report.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_one" time="1.5"/>'
        '<testcase classname="tests.test_a.TestGroup" name="test_two" time="0.5"/>'
        '<testcase classname="tests.lab.test_b" name="test_three[x]" time="4.0"/>'
        '<testcase classname="elsewhere" name="test_four" time="0.25"/>'
        "</testsuite></testsuites>"
    )
    assert ci_run.time_by_file(junit, tmp_path) == [
        {"file": "tests/lab/test_b.py", "tests": 1, "seconds": 4.0},
        {"file": "tests/test_a.py", "tests": 2, "seconds": 2.0},
        {"file": "elsewhere", "tests": 1, "seconds": 0.25},
    ]
    junit.write_text("<testsuites><testsuite")  # cut short: no table rather than a wrong one
    assert ci_run.time_by_file(junit, tmp_path) is None
    assert ci_run.time_by_file(tmp_path / "none.xml", tmp_path) is None


def test_a_record_made_before_cpu_seconds_were_kept_shows_a_dash():
    entry = {"total_s": 60.0, "cores": 2}
    assert ci_run.cores_busy(entry) == "-"
    assert ci_run.cores_busy({**entry, "cpu_s": 90.0}) == "75%"


def test_a_clone_with_no_shared_folder_beside_it_is_refused_before_anything_runs(tmp_path, capsys):
    repo = small_repository(tmp_path / "with_shared", "exit 0")
    clone, results = tmp_path / "elsewhere" / "clone", tmp_path / "results"
    clone.parent.mkdir()

    argv = ["--repo", str(repo), "--clone-into", str(clone), "--results", str(results)]
    assert ci_run.main(argv) == 2

    assert str(clone.parent / ci_run.SHARED) in capsys.readouterr().err
    assert not clone.exists() and not results.exists()


def test_an_existing_folder_is_never_cloned_into(tmp_path, capsys):
    repo = small_repository(tmp_path, "exit 0")
    taken = tmp_path / "taken"
    (taken / "work").mkdir(parents=True)

    assert ci_run.main(["--repo", str(repo), "--clone-into", str(taken)]) == 2
    assert str(taken) in capsys.readouterr().err
    assert (taken / "work").is_dir()


def test_the_docs_table_is_the_reports_output_over_the_committed_records():
    entries = machine_records.load(REPO_ROOT / ci_run.RESULTS)
    assert docs_blocks.read(REPO_ROOT / ci_run.PAGE, ci_run.BLOCK) == ci_run.block(entries)


def test_the_docs_index_quotes_the_latest_recorded_run_of_each_class():
    """docs/index.md's 'how long' rows for `bash .ci/run`: the range of the latest recorded
    run's minutes over the classes with bf16 instructions, and the latest run's of the class
    without, which trains in float32."""
    entries = machine_records.load(REPO_ROOT / ci_run.RESULTS)  # in the order they finished
    latest = {machine_records.machine_label(e): e for e in entries}
    bf16 = sorted(e["total_s"] / 60 for label, e in latest.items() if "no bf16" not in label)
    float32 = [e["total_s"] / 60 for label, e in latest.items() if "no bf16" in label]
    xeon = sorted({str(e["cpu"]["model"]) for label, e in latest.items() if "Xeon" in label})
    page = " ".join((REPO_ROOT / "docs" / "index.md").read_text(encoding="utf-8").split())
    expected = [
        f"| {bf16[0]:.0f}-{bf16[-1]:.0f} min, the latest recorded run of each class",
        f"| {float32[-1]:.0f} min, its latest recorded run |",
        f"2-core Intel Xeon (family 6, models {' and '.join(xeon)}) |",
    ]
    assert [line for line in expected if line not in page] == []
