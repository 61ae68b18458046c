"""benchmarks/startup.py: each entry timed in fresh interpreters and recorded with the machine,
and docs/test-suite.md's table of the committed records."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from benchmarks import machine_records, startup
from pipeline import docs_blocks
from tests.conftest import NUMBER_WORDS, REPO_ROOT


def test_a_run_times_each_entry_in_new_processes_and_records_every_sample(tmp_path, capsys):
    code = startup.main(["--results", str(tmp_path), "--repeats", "2", "--warmup", "0",
                         "--entries", "torch", "lightning"])  # fmt: skip
    assert code == 0
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    assert path.name == machine_records.record_name(entry)
    samples = entry["samples_s"]
    assert set(samples) == {"torch", "lightning"} and all(len(s) == 2 for s in samples.values())
    for name, seconds in samples.items():
        assert entry["median_s"][name] == pytest.approx(statistics.median(seconds), abs=1e-3)
    # each is loaded in the timed process, not in this one (where both are): Lightning, which
    # imports torch and more, takes longer than torch alone in every round
    assert all(lit > bare for lit, bare in zip(samples["lightning"], samples["torch"]))
    assert f"recorded {path}" in capsys.readouterr().out
    assert startup.main(["report", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out == startup.block([entry])


def test_the_commands_that_do_not_train_load_no_lightning_where_the_train_stage_does():
    """What the entries time is what each command loads."""
    check = "import sys; {}; print('lightning' in sys.modules)"
    loaded = {name: subprocess.run([sys.executable, "-c", check.format(startup.ENTRIES[name])],
                                   cwd=REPO_ROOT, capture_output=True, text=True,
                                   check=True, timeout=300).stdout.strip()
              for name in ("train stage", "evaluate stage")}  # fmt: skip
    assert loaded == {"train stage": "True", "evaluate stage": "False"}


def test_the_table_gives_each_entry_against_lightnings_import():
    medians = {"torch": 3.0, "lightning": 10.0, "train stage": 11.0}
    entry = {"provenance": {"commit": "abc1234", "hardware": "AMD EPYC, 2 cores"},
             "cpu": {"family": "25", "model": "1"}, "finished": "2026-01-02T09:00:00+00:00",
             "median_s": medians}  # fmt: skip
    assert startup.row(entry) == [
        "abc1234", "AMD EPYC, no bf16 (family 25, model 1)",
        "3.00 (0.30x)", "10.00", "11.00 (1.10x)", "-",
    ]  # fmt: skip


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--warmup", "-1"], ["--entries", "nothing"]])
def test_a_bad_option_is_refused_before_anything_runs(tmp_path, argv):
    with pytest.raises(SystemExit) as stopped:
        startup.main(["--results", str(tmp_path), *argv])
    assert stopped.value.code == 2 and not any(tmp_path.iterdir())


def test_the_docs_table_is_the_reports_output_over_the_committed_records():
    entries = machine_records.load(REPO_ROOT / startup.RESULTS)
    assert entries, "no start-up run committed"
    assert docs_blocks.read(REPO_ROOT / startup.PAGE, startup.BLOCK) == startup.block(entries)
    # the sentence before the table gives the rounds every committed run timed
    (rounds,) = {len(s) for e in entries for s in e["samples_s"].values()}
    text = " ".join((REPO_ROOT / startup.PAGE).read_text(encoding="utf-8").split())
    assert f"the median of {NUMBER_WORDS[rounds]} rounds" in text
