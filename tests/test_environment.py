"""The locked environment: requirements.lock satisfies pyproject.toml, this environment was
installed from it (what CI checks on a fresh clone), and results record its hash."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipeline import environment
from pipeline.environment import (
    LOCK_FILE,
    PYPROJECT,
    hardware_class,
    machine_and_processes,
    run_class,
)
from tests.conftest import REPO_ROOT, git, machine_line


def test_the_lock_pins_every_requirement_of_pyproject_within_its_range():
    assert environment.lock_problems() == []


def test_this_environment_is_the_locked_one():
    assert environment.installed_differences() == []


def test_the_lab_peer_is_installed_beside_the_environment_with_all_it_requires():
    """`make setup` puts the lab's peer (transformers) and what only it needs in the peers'
    folder: each package there finds every requirement it has, there or in the environment."""
    peers = list(metadata.distributions(path=[str(environment.PEERS_DIR)]))
    assert "transformers" in {canonicalize_name(dist.metadata["Name"]) for dist in peers}
    for dist in peers:
        for requirement in map(Requirement, dist.requires or []):
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue  # an optional extra's, or another platform's
            found = environment.installed_version(requirement.name)
            assert found and requirement.specifier.contains(found, prereleases=True), (
                f"{dist.metadata['Name']} requires {requirement}: found {found}"
            )


def test_a_process_that_imports_lightning_leaves_the_lab_peer_unloaded():
    """torchmetrics (which Lightning imports) loads transformers wherever it is installed:
    seconds in every training process, for a package only the lab's peer uses."""
    code = "import sys, lightning; print('transformers' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == ["False"], (
        "transformers is installed in the environment: `rm -rf .venv && make setup` puts it "
        f"in {environment.PEERS_DIR} instead"
    )


def test_a_lock_that_disagrees_with_pyproject_is_reported(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        PYPROJECT.read_text(encoding="utf-8").replace('"sacrebleu>=2.4"', '"sacrebleu>=99"')
    )
    lock = tmp_path / "requirements.lock"
    pins = LOCK_FILE.read_text(encoding="utf-8").splitlines()
    lock.write_text("\n".join(line for line in pins if not line.startswith("dvc==")) + "\n")
    problems = environment.lock_problems(pyproject, lock)
    assert any(p.startswith("sacrebleu>=99 is not satisfied by requirements.lock's ==")
               for p in problems)  # fmt: skip
    assert "dvc>=3.50 is not pinned in requirements.lock" in problems
    assert len(problems) == 2


def test_provenance_names_the_lock_by_its_hash():
    expected = hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()[: environment.HASH_CHARS]
    recorded = environment.provenance()
    assert recorded["environment_lock"] == expected
    assert recorded["commit"]  # CI runs in a clone
    assert "cores" in recorded["hardware"] or " x " in recorded["hardware"]  # CPU or GPU


def test_provenance_records_the_cpus_family_and_model(tmp_path):
    """A hardware class can span CPU families: every record names the family and model."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
    assert environment.cpu_id(environment.cpuinfo(cpuinfo)) == "family 25, model 17"
    assert environment.cpu_id(environment.cpuinfo(tmp_path / "none")) is None
    here = environment.cpuinfo()
    recorded = environment.provenance().get("cpu_id")
    if "cpu family" in here:
        assert recorded == f"family {here['cpu family']}, model {here['model']}"
    else:  # no /proc/cpuinfo family (not Linux, or not x86): nothing recorded
        assert recorded is None


def test_provenance_counts_the_packages_that_differ_from_the_lock(tmp_path, monkeypatch):
    assert "environment_differences" not in environment.provenance()  # installed from it
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK_FILE.read_text() + "sacrebleu==0.0.1\nno-such-package==1.0\n")
    monkeypatch.setattr(environment, "LOCK_FILE", lock)
    recorded = environment.provenance()
    assert recorded["environment_differences"] == 2
    assert recorded["environment_lock"] == environment.lock_hash(lock)


def test_a_copy_of_the_tree_without_git_records_the_commit_it_names(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "REPO_ROOT", tmp_path)  # files alone, no .git
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    assert environment.git_commit() is None
    monkeypatch.setenv(environment.COMMIT_ENV, "abc1234")
    assert environment.git_commit() == "abc1234"


def test_the_commit_a_launcher_names_wins_over_a_copied_checkouts_own(monkeypatch):
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    own = environment.git_commit()
    assert own is not None  # this checkout's HEAD
    monkeypatch.setenv(environment.COMMIT_ENV, "abc1234")
    assert environment.git_commit() == "abc1234"


def test_the_suites_machine_line_names_the_cpu_class_from_the_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\n"
                       "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 207\n")  # fmt: skip
    machine = f"machine: {environment.hardware()}"
    assert machine_line(cpuinfo) == f"{machine} (CPU family 25, model 17)"
    assert machine_line(tmp_path / "no_cpuinfo") == machine


def test_a_record_names_uncommitted_code_as_a_dirty_commit_and_records_as_clean(
    worktree, monkeypatch
):
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    head = git(worktree, "rev-parse", "--short", "HEAD")
    assert environment.code_commit(worktree) == head

    # What the code writes (a study's or a benchmark's records) leaves the code clean.
    for folder in environment.NOT_CODE:
        (worktree / folder).mkdir(parents=True, exist_ok=True)
        (worktree / folder / "new-record.json").write_text("{}")
    assert environment.code_commit(worktree) == head

    # A changed benchmark, a new config file: the code differs from the commit's.
    tool = worktree / "benchmarks" / "startup.py"
    tool.write_text(tool.read_text() + "\n# changed\n")
    changed = environment.code_commit(worktree)
    assert re.fullmatch(rf"{head}\+dirty\.[0-9a-f]{{{environment.DIRTY_HASH_CHARS}}}", changed)
    assert environment.code_commit(worktree) == changed  # the same changes, the same name
    (worktree / "conf" / "extra.yaml").write_text("lr: 1\n")
    assert environment.code_commit(worktree) not in (head, changed)

    # A launcher's commit is taken as it is: a copied tree's git can be stale.
    monkeypatch.setenv(environment.COMMIT_ENV, "abc1234")
    assert environment.code_commit(worktree) == "abc1234"


def test_provenance_and_the_study_pin_name_the_same_commit(monkeypatch):
    from pipeline.sweep import pin

    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    assert environment.provenance()["commit"] == pin.running_commit() == environment.code_commit()


def test_the_command_prints_provenance_as_json_and_help_as_usage(capsys):
    environment.cli([])
    printed = json.loads(capsys.readouterr().out)
    assert printed["environment_lock"] == environment.lock_hash(LOCK_FILE)
    with pytest.raises(SystemExit) as done:
        environment.cli(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m pipeline.environment")
    assert "--made-on" in out


@given(
    hardware=st.sampled_from(["AMD EPYC, 2 cores, avx512_bf16", "NVIDIA H200 x 8",
                              "Intel(R) Xeon(R) Processor, 16 cores, amx_bf16/avx512_bf16"]),
    processes=st.integers(min_value=1, max_value=4096),
)  # fmt: skip
def test_a_run_class_names_its_machine_and_processes_apart(hardware, processes):
    name = run_class(hardware, processes)
    assert machine_and_processes(name) == (hardware_class(hardware), processes)
    assert (name == hardware_class(hardware)) == (processes == 1)
