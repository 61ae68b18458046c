"""pipeline.cli: every stage answers --help and refuses unknown arguments before any compute."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, frameworks_loaded_by

STAGES = ("check", "prepare", "tokenize", "train", "evaluate", "summarize")


def _stage(stage: str, *args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"pipeline.stages.{stage}", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("stage", STAGES)
def test_stage_help_describes_it_and_runs_nothing(stage, tmp_path):
    """In a folder with a valid params.yaml: --help must not start the stage (no output
    folder, no W&B run), only print its usage and what it reads."""
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    result = _stage(stage, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: python -m pipeline.stages.{stage}")
    assert "params.yaml" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize("stage", STAGES)
def test_stage_refuses_an_unknown_argument_with_exit_2(stage, tmp_path):
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    result = _stage(stage, "model.heads=4", cwd=tmp_path)
    assert result.returncode == 2
    assert "unrecognized arguments: model.heads=4" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_console_scripts_exist_and_answer_help():
    """[project.scripts] in pyproject.toml: each target is a function that runs its command."""
    import tomllib

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"transformer-translate", "transformer-sweep"} <= set(scripts)
    for name, target in scripts.items():
        module, function = target.split(":")
        code = (f"import sys; sys.argv = [{name!r}, '--help']; "
                f"from {module} import {function}; {function}()")  # fmt: skip
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, (name, result.stderr[-2000:])
        assert result.stdout.startswith("usage: "), name


TOOLS = ("pipeline.sweep", "pipeline.sweep.upgrade", "pipeline.report", "pipeline.clean",
         "pipeline.results", "pipeline.environment", "pipeline.evaluation.decoding_search")  # fmt: skip


@pytest.mark.parametrize("module", TOOLS)
def test_help_of_the_tools_loads_no_torch_lightning_or_optuna(module):
    """`--help` answers at once: the frameworks (seconds to load) wait for a real command."""
    result = frameworks_loaded_by(module, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: python -m "), result.stdout[:200]
    assert result.stdout.splitlines()[-1] == "[]"


def _help(module: str) -> str:
    """`python -m <module> --help`; `module` may name a subcommand (`pipeline.results record`)."""
    result = subprocess.run([sys.executable, "-m", *module.split(), "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize("module", ["pipeline.sweep", "pipeline.sweep.upgrade", "pipeline.report",
                                    "pipeline.clean", "pipeline.results", "pipeline.results record",
                                    "pipeline.results table", "pipeline.translate",
                                    "pipeline.experiments", "pipeline.export", "pipeline.params",
                                    "pipeline.evaluation.decoding_search"])  # fmt: skip
def test_every_option_of_a_tools_help_says_what_it_is(module):
    """An option's line in `--help` carries its description, or the next line does (argparse
    moves it there when the option is long)."""
    lines = _help(module).split("\noptions:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for number, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        described = len(line.strip().split("  ", 1)) == 2
        continued = number + 1 < len(lines) and lines[number + 1].startswith(" " * 6)
        assert described or continued, f"{module}: {line.strip()} has no description"


def test_the_results_help_keeps_its_example_commands_one_a_line():
    text = _help("pipeline.results")
    assert (
        '\n    python -m pipeline.results record multi30k_tiny.en-de --command "make repro"\n'
        in text
    )
    assert "\n    python -m pipeline.results table --update-docs" in text
