"""pipeline.report.docs: the docs pages lead with a study's result: where it stands and what it
found, then its chart, then its tables; the front page carries the five-seed study's result."""

from __future__ import annotations

import re

import pytest

from pipeline import docs_blocks, sweep
from pipeline.errors import PipelineError
from pipeline.report import docs as report_docs
from pipeline.report.cli import cli
from tests.conftest import REPO_ROOT

REPORT = """Study `s`: 3 of 4 trials finished.

| variant | test |
|---|---|
| base | 30.0 |

**Progress**: 3 of 4 planned trials finished.

A/A check: none.

**In short**: the study is still running.

![bleu_per_variant](figures/s/bleu_per_variant.png)
![learning_curves](figures/s/learning_curves.png)
"""


def test_a_block_leads_with_the_progress_and_the_result_then_the_charts_then_the_tables():
    text = report_docs.lead_with_result(REPORT)
    parts = text.rstrip("\n").split("\n\n")
    assert [part.split()[0] for part in parts] == [
        "Study", "**Progress**:", "**In", "![bleu_per_variant](figures/s/bleu_per_variant.png)",
        "|", "A/A",
    ]  # fmt: skip
    assert parts[3].splitlines()[1].startswith("![learning_curves]")
    assert sorted(text.split()) == sorted(REPORT.split())  # moved, nothing lost or added
    assert report_docs.lead_with_result(text) == text


def test_the_docs_front_page_shows_the_five_seed_studys_result_and_chart():
    """docs/index.md's block is what `python -m pipeline.report table3_seeds --update-docs`
    writes there from the committed records: its progress, its result in short, its chart of
    BLEU per variant (a file the site holds), and the link to the tables."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/table3_seeds.yaml")
    study_dir = REPO_ROOT / sweep.RESULTS_ROOT / spec.study
    front = REPO_ROOT / docs_blocks.DOCS / report_docs.FRONT_PAGE
    name = f"{report_docs.block_name(spec.study)}:front"
    block = docs_blocks.read(front, name)
    assert block == report_docs.front_block(spec, study_dir, front)
    lines = [line for line in block.splitlines() if line]
    planned = len(spec.grid())
    assert re.match(rf"\d+ of {planned} trials finished at the study's pin", lines[0]), lines[0]
    assert lines[1].startswith("**In short**")
    chart = lines[2].split("](", 1)[1].rstrip(")")
    assert lines[2].startswith("![bleu_per_variant](") and (front.parent / chart).is_file()
    assert lines[3].endswith(f"[Table 3 ablations]({report_docs.study_page(spec.study).name}).")
    assert (front.parent / report_docs.study_page(spec.study).name).is_file()


def test_a_study_no_worker_has_begun_says_so_on_its_pages_and_has_no_report(tmp_path, capsys):
    """No storage and no record: `--update-docs` fills its page and README's line with 'not
    started' (what its first worker does), writes no report and no chart; without
    `--update-docs` the report is still a clear error."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    name = report_docs.block_name(spec.study)
    page, readme = tmp_path / report_docs.study_page(spec.study), tmp_path / "README.md"
    page.parent.mkdir()
    begin, end = docs_blocks.markers(name)
    page.write_text(f"# S\n\n{begin}\nold\n{end}\n")
    progress_begin, progress_end = docs_blocks.markers(f"{name}:progress")
    readme.write_text(f"# R\n\n{progress_begin}\nold\n{progress_end}\n")
    results = tmp_path / "results"

    with pytest.raises(PipelineError, match="no finished trials of study 'smoke'"):
        cli([str(REPO_ROOT / "ablations/smoke.yaml"), "--results-dir", str(results), "--no-wandb"])
    cli([str(REPO_ROOT / "ablations/smoke.yaml"), "--results-dir", str(results), "--no-wandb",
         "--update-docs", str(tmp_path)])  # fmt: skip

    trials = len(spec.grid())
    assert docs_blocks.read(readme, f"{name}:progress") == (
        f"0 of {trials} trials finished: not started; its first worker pins it.\n"
    )
    block = docs_blocks.read(page, name)
    assert block.startswith(f"Study `smoke`: not started, 0 of {trials} trials finished.")
    assert "![" not in block and not (results / spec.study).exists()
    assert "not started" in capsys.readouterr().out
