"""pipeline.report: the Table-3 table, findings, charts and README block from a study's records.

The records are laid out as `pipeline.sweep` writes them; their hypotheses are real Multi30k
references with controlled damage, so the expected numbers are computed independently here
with sacreBLEU itself.
"""

from __future__ import annotations

import gzip
import json
import statistics
import unicodedata

import matplotlib.image
import pytest
import sacrebleu

from pipeline import docs_blocks, report, sweep
from pipeline.training.module import LOSS_AVERAGE
from tests.conftest import REPO_ROOT

SPLIT = report.TEST_SPLIT


@pytest.fixture
def references(multi30k_dir):
    """The whole test split, normalised as `prepare` does (what the report scores against)."""
    with gzip.open(multi30k_dir / f"{SPLIT}.de.gz", "rt", encoding="utf-8") as f:
        return [" ".join(unicodedata.normalize("NFC", line).split()) for line in f]


def damaged(references: list[str], every: int, offset: int = 0) -> list[str]:
    """Drop the last word of every `every`-th sentence: a worse system, by a known amount."""
    return [
        " ".join(r.split()[:-1]) if i % every == offset else r for i, r in enumerate(references)
    ]


def lc_bleu(hypotheses: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score


# (every, offset): heads_8 damages as many sentences as base seed 1, other ones
DAMAGE = {
    ("base", 1): (3, 0),
    ("base", 2): (4, 0),
    ("heads_1", 1): (1, 0),
    ("heads_1", 2): (1, 0),
    ("heads_8", 1): (3, 1),
}


@pytest.fixture
def study(tmp_path, references):
    """A smoke-spec study folder with five finished trials' records."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.variants["heads_8"] = {"model.heads": 8}
    spec.paper = {"heads_1": {"bleu": -0.6, "ppl": 0.29, "rows": "(A) h=1 vs h=4"}}
    study_dir = tmp_path / "results" / spec.study
    study_dir.mkdir(parents=True)
    for (variant, seed), (every, offset) in DAMAGE.items():
        folder = study_dir / "trials" / f"{variant}-seed{seed}"
        folder.mkdir(parents=True)
        hyps = damaged(references, every, offset)
        (folder / f"{SPLIT}.hyp").write_text("\n".join(hyps) + "\n")
        val = 30.0 + seed + (variant == "heads_1")
        files = {
            "train.json": {"num_parameters": 1_000_000, "last": {"val/ppl": 10.0 + seed}},
            "eval.json": {
                SPLIT: {"bleu_lc": lc_bleu(hyps, references), "bleu_lc_ci": 1.5 + seed / 10},
                "val": {"bleu_lc": val},
            },
            "curve.json": [{"step": s, "val/bleu": s / 10 + seed} for s in (10, 20)],
            sweep.RUN_FILE: {
                "params": {"variant": variant, "seed": seed},
                "loss_average": LOSS_AVERAGE,
            },
        }
        for name, content in files.items():
            (folder / name).write_text(json.dumps(content))
    (study_dir / "trials" / "heads_8-seed2").mkdir()  # unfinished: no run.json, not counted
    return spec, study_dir


def test_variant_rows_match_independent_numbers(study, references):
    spec, study_dir = study
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir),
                                                      references)}  # fmt: skip
    base = [lc_bleu(damaged(references, e), references) for e in (3, 4)]
    worse = lc_bleu(damaged(references, 1), references)
    assert rows["base"].test_bleu == pytest.approx(base)
    assert rows["base"].test_half_width == pytest.approx(1.65)
    assert rows["heads_1"].delta == pytest.approx(worse - statistics.fmean(base))
    assert rows["heads_1"].val_bleu == [32.0, 33.0] and rows["heads_1"].val_ppl == [11.0, 12.0]
    assert rows["heads_8"].seeds == [1]  # its unfinished seed is not counted
    # Damaging every sentence vs every 3rd/4th: a real difference, so a small p-value; heads_8
    # (as many damaged sentences as base seed 1, other ones) cannot be told apart from it.
    assert rows["heads_1"].p_value < 0.05
    assert rows["heads_8"].p_value > 0.3
    assert rows["base"].p_value is None


def test_pooled_p_value_is_sacrebleus_paired_bootstrap_over_the_seeds_side_by_side(
    study, references
):
    spec, study_dir = study
    records = {(r.variant, r.seed): r for r in report.load_records(study_dir)}
    base = {seed: records[("base", seed)] for seed in (1, 2)}
    variant = [records[("heads_1", 1)], records[("heads_1", 2)]]
    pooled = report.pooled_p_value(base, variant, references)
    baseline = damaged(references, 3) + damaged(references, 4)
    system = damaged(references, 1) + damaged(references, 1)
    from sacrebleu.compat import BLEU
    from sacrebleu.significance import PairedTest

    with sacrebleu_seed():
        test = PairedTest([("baseline", baseline), ("system", system)],
                          {"bleu": BLEU(lowercase=True)}, references=[references * 2],
                          test_type="bs", n_samples=1000)  # fmt: skip
        _, results = test()
    assert pooled == pytest.approx(results["BLEU"][1].p_value)


def sacrebleu_seed():
    from pipeline.evaluation.scoring import DEFAULT_BOOTSTRAP_SEED, _sacrebleu_seed

    return _sacrebleu_seed(DEFAULT_BOOTSTRAP_SEED)


def test_findings_say_what_the_p_values_support(study, references):
    spec, study_dir = study
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    lines = report.findings(rows)
    heads_1 = next(line for line in lines if line.startswith("- heads_1"))
    assert "vs the paper's -0.6: significant, in the paper's direction: holds" in heads_1
    heads_8 = next(line for line in lines if line.startswith("- heads_8"))
    assert "not significant" in heads_8 and "no such row" in heads_8


def test_a_difference_where_the_paper_finds_none_does_not_hold(study, references):
    spec, study_dir = study
    for variant in ("heads_1", "heads_8"):
        spec.paper[variant] = {"bleu": -0.1, "rows": "(E)", "no_difference": "nearly identical"}
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    lines = {line.split(":")[0]: line for line in report.findings(rows)}
    assert lines["- heads_1"].endswith(
        'significant, where the paper finds no difference ("nearly identical"): does not hold.'
    )
    assert lines["- heads_8"].endswith('not significant, as the paper finds ("nearly identical").')


def test_perplexities_logged_as_batch_means_are_marked_as_such(study, references):
    spec, study_dir = study
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    assert "| 11.50 ± 0.71 |" in report.grid_table(rows) and "†" not in report.grid_table(rows)
    assert report.ppl_note(rows).endswith("perplexity per target subword.")
    # the base's records as made before TokenMean: no `loss_average`
    for run_file in study_dir.glob(f"trials/base-seed*/{sweep.RUN_FILE}"):
        run = json.loads(run_file.read_text())
        run_file.write_text(json.dumps({k: v for k, v in run.items() if k != "loss_average"}))
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    assert "| 11.50 ± 0.71 † |" in report.grid_table(rows)
    assert "| heads_1 | model.heads=1 | 1.00 M | 11.50 ± 0.71 |" in report.grid_table(rows)
    assert "except where marked †" in report.ppl_note(rows)


@pytest.mark.parametrize(
    ("heads_1_ppl", "paper_ppl", "verdict"),
    [
        ((12.0, 12.5), 0.29, "val PPL +0.75 vs the paper's +0.29: seeds overlap"),
        ((13.0, 14.0), 0.29, "val PPL +2.00 vs the paper's +0.29: seeds apart, in the paper's"),
        ((13.0, 14.0), -0.29, "val PPL +2.00 vs the paper's -0.29: seeds apart, against the"),
        ((9.0, 10.0), 0.0, "val PPL -2.00 vs the paper's +0.00: seeds apart, where the paper"),
    ],
)
def test_findings_set_the_perplexity_beside_the_papers(
    study, references, heads_1_ppl, paper_ppl, verdict
):
    spec, study_dir = study  # the base's val PPL: 11 and 12
    spec.paper["heads_1"]["ppl"] = paper_ppl
    for seed, ppl in zip((1, 2), heads_1_ppl):
        train = study_dir / "trials" / f"heads_1-seed{seed}" / "train.json"
        train.write_text(json.dumps({**json.loads(train.read_text()), "last": {"val/ppl": ppl}}))
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    heads_1 = next(line for line in report.findings(rows) if line.startswith("- heads_1"))
    assert verdict in heads_1


def test_report_files_and_readme_block(study, tmp_path):
    spec, study_dir = study
    path = report.write_report(spec, study_dir, log_to_wandb=False)
    text = path.read_text()
    assert "| base | (base recipe) | 1.00 M | 11.50 ± 0.71 | 31.50 ± 0.71 |" in text
    assert "| heads_1 | model.heads=1 |" in text and "-0.6 (PPL +0.29), (A) h=1 vs h=4 |" in text
    assert "Study `smoke`: 5 of 6 trials finished" in text
    for chart in ("bleu_per_variant", "learning_curves"):
        image = matplotlib.image.imread(study_dir / report.CHARTS[chart])
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert f"({report.CHARTS[chart]})" in text

    page, readme = tmp_path / report.PAGE, tmp_path / "README.md"
    page.parent.mkdir()
    begin, end = docs_blocks.markers(report.block_name(spec.study))
    page.write_text(f"# A\n\n{begin}\nold\n{end}\n\nafter\n")
    summary_begin, summary_end = docs_blocks.markers(f"{report.block_name(spec.study)}:summary")
    readme.write_text(f"# R\n\n{summary_begin}\nold\n{summary_end}\n")
    report.update_docs(spec, study_dir, tmp_path)
    block = report.docs_block(spec, study_dir, page)
    assert f"{begin}\n{block}{end}\n\nafter" in page.read_text()
    assert "(../results/smoke/bleu_per_variant.png)" in block  # linked from the page's folder
    summary = docs_blocks.read(readme, f"{report.block_name(spec.study)}:summary")
    assert summary.splitlines()[0] == "| " + " | ".join(report.SUMMARY_COLUMNS) + " |"
    assert "| heads_1 | model.heads=1 |" in summary and "\nold\n" not in readme.read_text()


def test_references_are_the_prepared_test_split(study, references):
    spec, _ = study
    assert report.test_references(spec) == references


def test_no_finished_trial_is_a_clear_error(tmp_path):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    with pytest.raises(report.PipelineError, match="no finished trials of study 'smoke'"):
        report.write_report(spec, tmp_path / "smoke", log_to_wandb=False)


@pytest.mark.parametrize("study_name", ["table3", "table3_label_smoothing"])
def test_the_docs_ablation_block_is_the_reports_output(study_name):
    """docs/ablation-results.md's section of each committed study (and README's summary, where
    README has one) is exactly what `python -m pipeline.report <study> --update-docs` makes of
    the committed records."""
    spec = sweep.load_spec(REPO_ROOT / f"ablations/{study_name}.yaml")
    study_dir = REPO_ROOT / sweep.RESULTS_ROOT / spec.study
    page, name = REPO_ROOT / report.PAGE, report.block_name(spec.study)
    assert docs_blocks.read(page, name) == report.docs_block(spec, study_dir, page)
    readme = REPO_ROOT / "README.md"
    if docs_blocks.markers(f"{name}:summary")[0] in readme.read_text():
        summary = report.summary_block(spec, study_dir, page)
        assert docs_blocks.read(readme, f"{name}:summary") == summary
