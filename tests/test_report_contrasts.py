"""The report's contrasts between variants (in the Holm family of the comparisons with the base)
and its heads x width grid, on synthetic trial records as `tests/test_report.py` writes them."""

# The fixtures of tests/test_report.py are imported and requested by name:
# ruff: noqa: F811
from __future__ import annotations

import itertools
import statistics

import pytest
from scipy import stats

from pipeline import report, sweep
from pipeline.evaluation import seed_stats
from pipeline.report import charts as charts_module
from pipeline.report.charts import charts
from pipeline.report.contrasts import extra_tables, head_shapes, heads_width_table
from pipeline.report.rows import holm_family
from tests.conftest import REPO_ROOT
from tests.test_report import (  # noqa: F401 (fixtures, requested by name)
    FIVE_SEEDS,
    damaged,
    five_seed_study,
    references,
    welch_p,
    write_trial,
)


def holm_by_hand(p_values: list[float]) -> list[float]:
    """The k-th smallest times m - k, kept non-decreasing, in the given order."""
    m, running, adjusted = len(p_values), 0.0, [0.0] * len(p_values)
    for k, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - k) * p_values[index]))
        adjusted[index] = running
    return adjusted


def test_contrasts_join_the_comparisons_with_the_base_in_one_holm_family(five_seed_study):
    """Two contrasts beside six comparisons with the base: eight in one family, each contrast
    Welch's test of its two variants' seed-level BLEU; one with a variant run under other
    conditions is not made and counts as p = 1."""
    spec, study_dir, refs = five_seed_study
    spec.contrasts = [["heads_16", "heads_8"], ["heads_1", "dropout_0.0"]]
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir), refs)}
    with_base = ["heads_1", "heads_2", "heads_8", "heads_16", "learned_positions"]
    contrast_p = welch_p(rows["heads_16"].test_bleu, rows["heads_8"].test_bleu)
    p_values = [welch_p(rows[v].test_bleu, rows["base"].test_bleu) for v in with_base]
    p_values += [1.0, contrast_p, 1.0]  # dropout_0.0 with the base, then the two contrasts
    adjusted = holm_by_hand(p_values)
    assert [rows[v].holm_p for v in with_base] == pytest.approx(adjusted[:5])
    assert report.family_size(spec) == 8

    family = holm_family(spec, list(rows.values()))
    made, not_made = family[-2:]
    assert made.label == "heads_16 vs heads_8" and made.welch_p == pytest.approx(contrast_p)
    # the exact permutation test beside it, by enumerating every relabelling of the 10 runs
    runs = rows["heads_16"].test_bleu + rows["heads_8"].test_bleu
    observed = abs(statistics.fmean(runs[:5]) - statistics.fmean(runs[5:]))
    splits = list(itertools.combinations(range(10), 5))
    extreme = sum(
        abs(statistics.fmean(runs[i] for i in group)
            - statistics.fmean(runs[i] for i in range(10) if i not in group)) >= observed - 1e-9
        for group in splits
    )  # fmt: skip
    assert made.permutation_p == pytest.approx(extreme / len(splits))
    assert not_made.permutation_p is None
    assert made.holm_p == pytest.approx(adjusted[6])
    assert made.delta == pytest.approx(rows["heads_16"].test_mean - rows["heads_8"].test_mean)
    scipy_ci = stats.ttest_ind(rows["heads_16"].test_bleu, rows["heads_8"].test_bleu,
                               equal_var=False).confidence_interval()  # fmt: skip
    assert made.delta_interval == pytest.approx(tuple(scipy_ci))
    assert made.verdict == ("differs" if made.holm_p <= 0.05 else "cannot tell")
    assert not_made.welch_p is None and not_made.holm_p is None and not_made.delta is not None
    assert not_made.no_test_reason == "the two ran under different conditions"

    # a contrast that cannot tell says what it could have detected, at its own Holm step
    rank = sorted(p_values).index(contrast_p)
    assert made.holm_alpha == pytest.approx(0.05 / (len(p_values) - rank))
    if made.verdict == "cannot tell":
        spread = statistics.fmean([statistics.variance(rows[v].test_bleu)
                                   for v in ("heads_16", "heads_8")]) ** 0.5  # fmt: skip
        assert made.detectable == pytest.approx(
            seed_stats.detectable_difference(spread, 5, alpha=made.holm_alpha)
        )
        verdict_text = (
            f"cannot tell (at these seeds' spread Welch's test detects {made.detectable:.2f}"
        )
    else:
        verdict_text = made.verdict

    (table,) = extra_tables(spec, list(rows.values()))
    assert f"| heads_16 vs heads_8 | {made.delta:+.2f} [" in table
    assert f"| {made.welch_p:.3f} | {made.holm_p:.3f} | {made.verdict}" in table
    assert f" | {made.permutation_p:.3f} | {made.ppl_delta:+.2f} | " in table
    assert "| heads_1 vs dropout_0.0 | " in table
    # and in prose under the table, each with its test or why there is none
    low, high = made.delta_interval
    assert (
        f"- heads_16 vs heads_8: {made.delta:+.2f} [{low:+.2f}, {high:+.2f}] BLEU (5 vs 5 seeds; "
        f"Welch p = {made.welch_p:.3f}, Holm p = {made.holm_p:.3f}; exact permutation p = "
        f"{made.permutation_p:.3f}): {verdict_text}"
    ) in table
    assert (
        f"- heads_1 vs dropout_0.0: {not_made.delta:+.2f} BLEU: cannot tell (no seed-level test: "
        "the two ran under different conditions)."
    ) in table
    # the one-sentence summary counts the contrast under its verdict
    in_short = report.summary(list(rows.values()), spec)
    assert f"heads_16 vs heads_8 ({made.delta:+.2f})" in in_short.split(f"{made.verdict}: ")[1]
    not_compared = in_short.split("not compared (other run conditions): ")[1]
    assert f"heads_1 vs dropout_0.0 ({not_made.delta:+.2f})" in not_compared


def test_without_contrasts_the_family_is_the_comparisons_with_the_base(five_seed_study):
    spec, study_dir, refs = five_seed_study
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    assert len(holm_family(spec, rows)) == report.family_size(spec) == 6
    assert extra_tables(spec, rows) == []


WIDTHS = {  # variant: (overrides, damage per seed); the smoke model: d_model 64, 4 heads
    "base": ({}, [(4, 0), (5, 0)]),
    "heads_8": ({"model.heads": 8}, [(3, 0), (3, 1)]),
    "heads_8_dk16": ({"model.heads": 8, "model.head_dim": 16}, [(2, 0), (2, 1)]),
    "dk_8": ({"model.head_dim": 8}, [(6, 0), (7, 0)]),
    "layers_1": ({"model.encoder_layers": 1}, [(2, 0), (2, 1)]),
}


@pytest.fixture
def widths_study(tmp_path, references):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.variants = {name: overrides for name, (overrides, _) in WIDTHS.items()}
    refs = references  # the whole test split: what the report's Markdown scores against
    study_dir = tmp_path / "results" / spec.study
    for variant, (_, damage) in WIDTHS.items():
        for seed, (every, offset) in enumerate(damage, start=1):
            write_trial(study_dir, variant, seed, damaged(refs, every, offset), refs)
    return spec, study_dir, refs


def test_heads_width_grid_places_each_variant_by_h_and_d_k(widths_study):
    """h rows, d_k columns, the mean test BLEU over seeds; a variant changing anything else
    (layers_1) is left out; the base (4 heads of 64 / 4 = 16) sits at (4, 16)."""
    spec, study_dir, refs = widths_study
    assert head_shapes(spec) == {"base": (4, 16), "heads_8": (8, 8), "heads_8_dk16": (8, 16),
                                 "dk_8": (4, 8)}  # fmt: skip
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir), refs)}
    table = heads_width_table(spec, list(rows.values())).splitlines()
    assert table[2:] == [
        "| h \\ d_k | 8 | 16 |",
        "|---|---|---|",
        f"| 4 | {rows['dk_8'].test_mean:.2f} (2, dk_8) | {rows['base'].test_mean:.2f} (2, base) |",
        f"| 8 | {rows['heads_8'].test_mean:.2f} (2, heads_8) | "
        f"{rows['heads_8_dk16'].test_mean:.2f} (2, heads_8_dk16) |",
    ]
    spec.contrasts = [["heads_8_dk16", "heads_8"], ["dk_8", "heads_8"]]
    text = report.markdown(spec, study_dir, with_states=False)
    assert "\n".join(table) in text
    assert "| heads_8_dk16 vs heads_8 | " in text and "| dk_8 vs heads_8 | " in text
    # the findings say what each contrast holds apart: the count of heads or their width
    assert "\n- heads_8_dk16 vs heads_8 (the same 8 heads, d_k 16 against 8): " in text
    assert "\n- dk_8 vs heads_8 (the same head width d_k 8, 4 heads against 8): " in text
    assert "across the spec's 6 comparisons with the base and between the variants it" in text


def test_a_contrast_in_a_study_still_running_is_an_interim_estimate(widths_study):
    """While planned seeds run on, a contrast shows its difference and Welch interval as an
    estimate, with no test and no verdict, as the comparisons with the base do; once every
    planned seed has finished it is tested."""
    import optuna

    spec, study_dir, refs = widths_study
    spec.contrasts = [["heads_8_dk16", "heads_8"]]
    spec.seeds = [1, 2, 3]
    pin = {"commit": "abc1234", "hardware": "AMD EPYC, avx512_bf16", "precision": "bf16-mixed"}
    storage = f"sqlite:///{study_dir / 'study.db'}"
    optuna.create_study(study_name=spec.study, storage=storage).set_user_attr("pin", pin)
    pinned = report.study_pin(spec, study_dir)

    def contrast_and_table():
        rows = report.variant_rows(spec, report.load_records(study_dir), refs, pinned)
        contrast = holm_family(spec, rows)[-1]
        by_name = {r.variant: r for r in rows}
        ci = stats.ttest_ind(by_name["heads_8_dk16"].test_bleu, by_name["heads_8"].test_bleu,
                             equal_var=False).confidence_interval()  # fmt: skip
        assert contrast.delta_interval == pytest.approx(tuple(ci))
        return contrast, extra_tables(spec, rows)[0]

    contrast, table = contrast_and_table()
    assert contrast.interim and contrast.delta is not None
    assert contrast.welch_p is None and contrast.holm_p is None and contrast.verdict is None
    assert f"| heads_8_dk16 vs heads_8 | {contrast.delta:+.2f} [" in table
    assert "| - | - | interim: no test yet |" in table
    low, high = contrast.delta_interval
    assert (
        f"- heads_8_dk16 vs heads_8 (the same 8 heads, d_k 16 against 8): interim estimate "
        f"{contrast.delta:+.2f} [{low:+.2f}, {high:+.2f}] BLEU (2 vs 2 seeds): no test until "
        "every planned seed has finished."
    ) in table

    for variant, (_, damage) in WIDTHS.items():  # every planned seed: the study is complete
        write_trial(study_dir, variant, 3, damaged(refs, *damage[0]), refs)
    contrast, table = contrast_and_table()
    assert not contrast.interim and contrast.welch_p is not None
    assert contrast.verdict in ("differs", "cannot tell")
    assert f"| {contrast.welch_p:.3f} | {contrast.holm_p:.3f} | {contrast.verdict}" in table
    assert (
        f"- heads_8_dk16 vs heads_8 (the same 8 heads, d_k 16 against 8): {contrast.delta:+.2f} ["
    ) in table
    assert f"BLEU (3 vs 3 seeds; Welch p = {contrast.welch_p:.3f}, Holm p = " in table


@pytest.mark.slow  # the bootstrap, the charts and a W&B run
def test_the_report_run_logs_the_contrasts_and_the_heads_width_grid(widths_study, tmp_path):
    """The study's W&B report run carries what the page shows beside the comparisons with the
    base: the contrasts (each a verdict in the summary too) and the heads x width grid, as a
    table and as the chart the page shows."""
    import json

    import matplotlib.image

    from pipeline import tracking

    spec, study_dir, refs = widths_study
    spec.contrasts = [["heads_8_dk16", "heads_8"], ["dk_8", "heads_8"]]
    text = report.write_report(spec, study_dir, log_to_wandb=True).read_text()
    chart = report.CHARTS["heads_width"]
    assert matplotlib.image.imread(study_dir / chart).shape[0] > 100
    assert f"![heads_width]({chart})" in text
    base = next(r for r in report.variant_rows(spec, report.load_records(study_dir), refs)
                if r.variant == "base")  # fmt: skip
    low, high = base.test_interval
    assert charts_module._cell_text(base) == (
        f"{base.test_mean:.2f} ± {(high - low) / 2:.2f}\nbase, 2 seeds"
    )
    base.test_bleu, base.test_half_widths = base.test_bleu[:1], []  # one seed: no interval
    assert charts_module._cell_text(base) == f"{base.test_bleu[0]:.2f}\nbase, 1 seed"
    (run_dir,) = tracking.offline_run_dirs(tmp_path / "wandb" / spec.study)
    logged = tracking.read_offline_run(run_dir)
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    contrasts = holm_family(spec, rows)[-2:]
    assert logged["summary"]["verdicts"] == {
        **{r.variant: report.verdict_cell(r) for r in rows if r.delta is not None},
        **{c.label: report.verdict_cell(c) for c in contrasts},
    }

    def table(key: str) -> list[list]:
        (path,) = (run_dir / "files" / "media" / "table").glob(f"{key}_*.table.json")
        return json.loads(path.read_text())["data"]

    assert [[row[0], row[1], row[4], row[5], row[6], row[7]]
            for row in table("contrast_table")] == [
        [c.label, pytest.approx(c.delta), pytest.approx(c.welch_p), pytest.approx(c.holm_p),
         report.verdict_cell(c), pytest.approx(c.permutation_p)] for c in contrasts
    ]  # fmt: skip
    (artifact,) = [a for a in logged["artifacts"] if a["type"] == "report"]
    assert chart in artifact["files"]
    means = {r.variant: r.test_mean for r in rows}
    assert table("heads_width_table") == [
        [4, 8, "dk_8", 2, pytest.approx(means["dk_8"])],
        [4, 16, "base", 2, pytest.approx(means["base"])],
        [8, 8, "heads_8", 2, pytest.approx(means["heads_8"])],
        [8, 16, "heads_8_dk16", 2, pytest.approx(means["heads_8_dk16"])],
    ]


def test_no_heads_width_grid_where_no_variant_sets_head_dim(five_seed_study):
    """A study of heads alone (d_k = d_model / h throughout) gets no grid: it would be a
    diagonal."""
    spec, study_dir, refs = five_seed_study
    assert head_shapes(spec) == {}
    records = report.load_records(study_dir)
    rows = report.variant_rows(spec, records, refs)
    assert heads_width_table(spec, rows) == ""
    assert "heads_width" not in charts(spec, rows, records, study_dir)
    assert set(FIVE_SEEDS) <= {r.variant for r in rows}


def test_the_heads_and_size_spec_states_its_budget_and_what_its_seeds_detect():
    """ablations/table3_bc.yaml: its trial_hours add up to what its comments say, within the
    study's 70 worker-hours, and its comments' detectable differences are Welch's at Holm's
    strictest step over the whole family (comparisons with the base and contrasts), at the
    spread of table3_seeds' committed base seeds."""
    from pipeline.sweep.spec import planned_hours
    from tests.test_report import committed_records, spec_comments

    spec = sweep.load_spec(REPO_ROOT / "ablations/table3_bc.yaml")
    text = spec_comments("table3_bc")
    hours = planned_hours(spec)
    assert hours <= 70
    assert (
        f"{len(spec.variants)} variants, {len(spec.grid())} trials, {hours:.1f} worker-hours"
        in text
    )
    m = report.family_size(spec)
    assert m == len(spec.variants) - 1 + len(spec.contrasts) == 12
    detect = seed_stats.detectable_difference
    per_comparison, strictest = detect(1.0, 5), detect(1.0, 5, alpha=0.05 / m)
    base = committed_records(REPO_ROOT / sweep.RESULTS_ROOT / "table3_seeds")["base"]
    sd = statistics.stdev(r["test"] for r in base)
    assert (
        f"Holm's strictest step is 0.05 / {m}, where five seeds detect {strictest:.1f} "
        f"seed-level SDs with 80% power ({per_comparison:.1f} per comparison); at the spread of "
        f"table3_seeds' five base seeds (SD {sd:.2f} BLEU) that is {strictest * sd:.1f} and "
        f"{per_comparison * sd:.1f} BLEU"
    ) in text


def test_the_paper_column_names_a_narrower_head_only_where_d_k_follows_d_model():
    """heads_8 (d_k = 128 / 8) is a narrower head than the paper's h=8; heads_8_dk32 sets d_k
    itself, as the paper's rows it is set against do, and is not called narrower."""
    from pipeline.report.paper import unlike_paper

    spec = sweep.load_spec(REPO_ROOT / "ablations/table3_bc.yaml")
    assert "a head is 128/8 = 16 wide" in unlike_paper(spec, "heads_8")
    assert unlike_paper(spec, "heads_8_dk32") is None
    assert unlike_paper(spec, "dk_16") is None
