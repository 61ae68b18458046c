"""pipeline.report: the Table-3 table, findings, charts and README block from a study's records.

The records are laid out as `pipeline.sweep` writes them; their hypotheses are real Multi30k
references with controlled damage, so the expected numbers are computed independently here
with sacreBLEU itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gzip
import hashlib
import itertools
import json
import re
import sqlite3
import statistics
import subprocess
import sys
import unicodedata

import matplotlib.image
import pytest
import sacrebleu
from scipy import stats

from pipeline import docs_blocks, report, sweep
from pipeline.environment import hardware_class
from pipeline.errors import PipelineError
from pipeline.evaluation import seed_stats
from pipeline.sweep.records import LOSS_AVERAGE
from pipeline.sweep.spec import RESULTS_ROOT
from tests.conftest import NUMBER_WORDS, REPO_ROOT

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


def welch_p(a: list[float], b: list[float]) -> float:
    """Welch's two-sided p, as scipy computes it."""
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


# (every, offset): heads_8 damages as many sentences as base seed 1, other ones
DAMAGE = {
    ("base", 1): (3, 0),
    ("base", 2): (4, 0),
    ("heads_1", 1): (1, 0),
    ("heads_1", 2): (1, 0),
    ("heads_8", 1): (3, 1),
}


# what a trial records of where it ran (pipeline.environment.provenance, hardware())
RAN_AT = {"commit": "abc1234", "hardware": "AMD EPYC, 2 cores, avx512_bf16",
          "precision": "bf16-mixed"}  # fmt: skip


def write_trial(
    study_dir, variant, seed, hyps, references, ran_at=None, val=None, ppl=None
) -> None:
    """A finished trial's record folder, as pipeline.sweep writes it (its val BLEU and val PPL
    as given, else made from the seed)."""
    folder = study_dir / "trials" / f"{variant}-seed{seed}"
    folder.mkdir(parents=True)
    (folder / f"{SPLIT}.hyp").write_text("\n".join(hyps) + "\n")
    val = 30.0 + seed + (variant == "heads_1") if val is None else val
    ppl = 10.0 + seed if ppl is None else ppl
    ran_at = ran_at or RAN_AT
    files = {
        "train.json": {"num_parameters": 1_000_000, "last": {"val/ppl": ppl}},
        "eval.json": {
            SPLIT: {"bleu_lc": lc_bleu(hyps, references), "bleu_lc_ci": 1.5 + seed / 10},
            "val": {"bleu_lc": val},
        },
        "curve.json": [{"step": s, "val/greedy_bleu": s / 10 + seed} for s in (10, 20)],
        sweep.RUN_FILE: {
            "params": {"variant": variant, "seed": seed},
            **ran_at,
            "loss_average": LOSS_AVERAGE,
            "attempts": [{"outcome": "finished", "hardware": ran_at["hardware"]}],
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))


@pytest.fixture
def study(tmp_path, references):
    """A smoke-spec study folder with five finished trials' records."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.variants["heads_8"] = {"model.heads": 8}
    spec.paper = {"heads_1": {"bleu": -0.6, "ppl": 0.29, "rows": "(A) h=1 vs h=4"}}
    study_dir = tmp_path / "results" / spec.study
    study_dir.mkdir(parents=True)
    for (variant, seed), (every, offset) in DAMAGE.items():
        write_trial(study_dir, variant, seed, damaged(references, every, offset), references)
    (study_dir / "trials" / "heads_8-seed2").mkdir()  # unfinished: no run.json, not counted
    return spec, study_dir


# scipy warns that heads_1's two seeds score alike; Welch's test of them is what is checked
@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")
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
    # the seed-level tests: Welch's (heads_1's two seeds score alike, the base's do not) ...
    heads_1 = rows["heads_1"].test_bleu
    assert heads_1[0] == heads_1[1] and max(heads_1) < min(base)
    assert rows["heads_1"].welch_p == pytest.approx(welch_p(heads_1, base))
    # ... and every relabelling of the 4 runs (2 and 2), by hand
    assert rows["heads_1"].permutation_p == pytest.approx(2 / 6)  # the split and its mirror
    assert rows["heads_8"].permutation_p == pytest.approx(1.0)  # 1 run against 2: none smaller
    # heads_8's single seed gives Welch's test no spread: no p, and it stays in Holm's family
    assert rows["heads_8"].welch_p is None and rows["heads_8"].holm_p is None
    assert rows["heads_8"].no_test_reason == seed_stats.SINGLE_RUN
    assert rows["heads_1"].holm_p == pytest.approx(min(1.0, 2 * welch_p(heads_1, base)))
    low, high = rows["base"].test_interval
    half = 12.7062047 * statistics.stdev(base) / 2**0.5  # t(0.975, 1 df)
    assert (low, high) == pytest.approx(
        (statistics.fmean(base) - half, statistics.fmean(base) + half)
    )


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


def test_variants_tested_together_get_the_p_each_gets_alone(study, references):
    """The variants that share their seeds with the base are tested in one sacreBLEU test: each
    p is the one its own test gives, a variant of other seeds (heads_8, seed 1 alone) too."""
    spec, study_dir = study
    records = report.load_records(study_dir)
    base = {r.seed: r for r in records if r.variant == "base"}
    variants = {name: [r for r in records if r.variant == name] for name in ("heads_1", "heads_8")}
    variants["heads_1 again"] = variants["heads_1"]
    together = report.pooled_p_values(base, variants, references)
    alone = {
        name: report.pooled_p_value(base, group, references) for name, group in variants.items()
    }
    assert together == alone and together["heads_1"] != together["heads_8"]
    assert report.pooled_p_values({}, variants, references) == dict.fromkeys(variants)


def sacrebleu_seed():
    from pipeline.evaluation.scoring import DEFAULT_BOOTSTRAP_SEED, _sacrebleu_seed

    return _sacrebleu_seed(DEFAULT_BOOTSTRAP_SEED)


def test_sentence_bootstrap_significance_over_two_seeds_is_not_a_verdict(study, references):
    """Two seeds a side: the sentence bootstrap's p is tiny, but the runs are the unit and two
    seeds of the base are too few to tell a difference from their spread; one seed (heads_8)
    is no test at all."""
    spec, study_dir = study
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    lines = report.findings(rows)
    heads_1 = next(line for line in lines if line.startswith("- heads_1"))
    assert next(r for r in rows if r.variant == "heads_1").p_value < 0.05
    assert "vs the paper's -0.6: cannot tell" in heads_1 and "holds" not in heads_1
    heads_8 = next(line for line in lines if line.startswith("- heads_8"))
    assert "no Welch test;" in heads_8 and "no such row" in heads_8
    assert f"cannot tell (no seed-level test: {seed_stats.SINGLE_RUN})" in heads_8


@pytest.mark.parametrize(
    ("delta", "holm_p", "paper", "expected"),
    [
        (-1.0, 0.01, {"bleu": -0.6}, report.HOLDS),
        (-1.0, 0.01, {"bleu": 0.3}, report.CONTRADICTS),
        (-1.0, 0.2, {"bleu": -0.6}, report.CANNOT_TELL),
        (-1.0, 0.01, {}, report.DIFFERS),
        (-1.0, None, {"bleu": -0.6}, report.CANNOT_TELL),  # no test could be made
        (-1.0, None, {}, report.CANNOT_TELL),
        (-1.0, 0.2, {}, report.CANNOT_TELL),
        (-1.0, 0.01, {"bleu": -0.1, "no_difference": "nearly identical"}, report.CONTRADICTS),
        # no difference found is not the paper's "no difference": no equivalence is tested
        (-0.1, 0.9, {"bleu": -0.1, "no_difference": "nearly identical"}, report.CANNOT_TELL),
    ],
)
def test_verdict_words(delta, holm_p, paper, expected):
    assert report.verdict(delta, holm_p, paper) == expected


# (every, offset) per seed: heads_1, heads_8, heads_2 and learned damage more sentences than
# any seed of the base; heads_16 as many as the base, other ones
FIVE_SEEDS = {
    "base": [(4, 0), (5, 0), (6, 0), (7, 0), (8, 0)],
    "heads_1": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    "heads_8": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    "heads_2": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    "heads_16": [(4, 1), (5, 1), (6, 1), (7, 1), (8, 1)],
    "learned_positions": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    "dropout_0.0": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
}
OTHER_COMMIT = {**RAN_AT, "commit": "def5678"}


@pytest.fixture
def five_seed_study(tmp_path, references):
    """Five seeds per variant on the first 200 test sentences; dropout_0.0 ran at another
    commit than the base."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.seeds = [1, 2, 3, 4, 5]
    spec.variants = {
        "base": {},
        "heads_1": {"model.heads": 1},
        "heads_2": {"model.heads": 2},
        "heads_8": {"model.heads": 8},
        "heads_16": {"model.heads": 16},
        "dropout_0.0": {"model.dropout": 0.0},
        "learned_positions": {"model.positional": "learned"},
    }
    spec.paper = {
        "heads_1": {"bleu": -0.6, "rows": "(A)"},
        "heads_8": {"bleu": 0.3, "rows": "(A)"},
        "heads_16": {"bleu": 0.3, "rows": "(A)"},
        "dropout_0.0": {"bleu": -1.2, "rows": "(D)"},
        "learned_positions": {"bleu": -0.1, "rows": "(E)", "no_difference": "nearly identical"},
    }
    refs = references[:200]
    study_dir = tmp_path / "results" / spec.study
    for variant, damage in FIVE_SEEDS.items():
        for seed, (every, offset) in enumerate(damage, start=1):
            ran_at = OTHER_COMMIT if variant == "dropout_0.0" else RAN_AT
            write_trial(study_dir, variant, seed, damaged(refs, every, offset), refs, ran_at)
    return spec, study_dir, refs


def test_five_seeds_give_holm_corrected_verdicts_from_the_seed_level_test(five_seed_study):
    spec, study_dir, refs = five_seed_study
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir), refs)}
    base = rows["base"].test_bleu
    extreme = 2 / 252  # every run of the variant below every run of the base, 5 against 5
    for variant in ("heads_1", "heads_8", "heads_2", "learned_positions"):
        assert rows[variant].permutation_p == pytest.approx(extreme)
    welch = {v: welch_p(rows[v].test_bleu, base)
             for v in ("heads_1", "heads_8", "heads_2", "heads_16", "learned_positions")}  # fmt: skip
    assert {v: rows[v].welch_p for v in welch} == pytest.approx(welch)
    # Holm over the spec's 6 comparisons with the base, dropout_0.0's (other conditions: not
    # made) counted as p = 1, by hand: the k-th smallest times 6 - k, kept non-decreasing
    order = sorted(welch, key=welch.get)
    running = 0.0
    for k, variant in enumerate(order):
        running = max(running, min(1.0, (6 - k) * welch[variant]))
        assert rows[variant].holm_p == pytest.approx(running)
    assert report.family_size(spec) == 6
    # the difference's interval is the one Welch's test inverts (scipy's), val PPL likewise
    for variant in welch:
        scipy_ci = stats.ttest_ind(rows[variant].test_bleu, base, equal_var=False)
        assert rows[variant].delta_interval == pytest.approx(tuple(scipy_ci.confidence_interval()))
    # four large effects: Welch's p goes below the permutation test's floor of 2/252 and all
    # four pass Holm; heads_16 (as good as the base) does not
    assert min(welch.values()) < extreme
    large = ("heads_1", "heads_8", "heads_2", "learned_positions")
    assert max(rows[v].holm_p for v in large) <= 0.05
    assert welch["heads_16"] > 0.05
    assert {v: r.verdict for v, r in rows.items()} == {
        "base": None,
        "heads_1": "holds",
        "heads_8": "contradicts",
        "heads_2": "differs",
        "heads_16": "cannot tell",
        "learned_positions": "contradicts",
        "dropout_0.0": "cannot tell",
    }
    assert not rows["dropout_0.0"].comparable and rows["dropout_0.0"].welch_p is None
    assert rows["dropout_0.0"].permutation_p is None
    assert rows["dropout_0.0"].holm_p is None and rows["dropout_0.0"].p_value is None
    lines = {line.split(":")[0]: line for line in report.findings(list(rows.values()))}
    assert (
        '-0.1: contradicts (the paper finds "nearly identical"); val PPL +0.00: cannot tell'
    ) in lines["- learned_positions"]
    assert (
        f"5 vs 5 seeds; Welch p = {welch['heads_1']:.3f}, Holm p = {rows['heads_1'].holm_p:.3f}; "
        "exact permutation p = 0.008; sentence bootstrap p = "
    ) in lines["- heads_1"]


def test_a_variant_run_under_other_conditions_is_shown_apart_naming_both(five_seed_study):
    spec, study_dir, refs = five_seed_study
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    table = report.grid_table(rows)
    assert "| dropout_0.0 |" not in table and "| heads_1 |" in table
    apart = report.other_conditions_table(rows)
    base_row = next(line for line in apart.splitlines() if line.startswith("| base |"))
    assert base_row.endswith("| commit abc1234, AMD EPYC, avx512_bf16, bf16-mixed |")
    assert "| dropout_0.0 | model.dropout=0.0 |" in apart
    assert "| commit def5678, AMD EPYC, avx512_bf16, bf16-mixed |" in apart
    finding = next(line for line in report.findings(rows) if line.startswith("- dropout_0.0"))
    assert "cannot tell, not compared: it ran under other run conditions" in finding
    # provenance lives in the table's column, never in a sentence
    assert "abc1234" not in finding and "def5678" not in finding
    assert "abc1234" not in apart.splitlines()[0]
    assert "Welch" not in finding and "permutation" not in finding
    assert "not compared (other run conditions): dropout_0.0" in report.summary(rows)


@pytest.mark.parametrize(
    ("changed", "value"),
    [
        ("hardware", "Intel(R) Xeon(R) Processor, 2 cores, amx_bf16/avx512_bf16"),
        ("precision", "32-true"),
    ],
)
def test_another_hardware_class_or_precision_is_not_compared(tmp_path, references, changed, value):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    study_dir = tmp_path / spec.study
    refs = references[:100]
    for seed, every in ((1, 3), (2, 4)):
        write_trial(study_dir, "base", seed, damaged(refs, every), refs)
        write_trial(study_dir, "heads_1", seed, damaged(refs, 1), refs, {**RAN_AT, changed: value})
    heads_1 = report.variant_rows(spec, report.load_records(study_dir), refs)[1]
    assert not heads_1.comparable and heads_1.welch_p is None
    assert value.replace(", 2 cores", "") in report.other_conditions_table([
        *report.variant_rows(spec, report.load_records(study_dir), refs)
    ])  # fmt: skip


def test_hardware_class_ignores_core_and_device_counts_but_not_the_processes_that_trained():
    assert hardware_class("AMD EPYC, 2 cores, avx512_bf16") == "AMD EPYC, avx512_bf16"
    assert hardware_class("AMD EPYC, 16 cores, avx512_bf16") == "AMD EPYC, avx512_bf16"
    assert hardware_class("NVIDIA H200 x 1") == "NVIDIA H200"
    assert hardware_class("NVIDIA H100 80GB HBM3 x 8") == "NVIDIA H100 80GB HBM3"
    assert report.run_class("NVIDIA H200 x 8", 1) == report.run_class("NVIDIA H200 x 1", 1)
    assert report.run_class("NVIDIA H200 x 8", 4) == "NVIDIA H200, 4 processes"


def test_a_trial_trained_on_more_processes_is_not_compared(tmp_path, references):
    """`train.devices: auto` on a machine of more GPUs trains with a larger global batch: the
    same GPU class, other conditions."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    study_dir = tmp_path / spec.study
    refs = references[:100]
    for seed, every in ((1, 3), (2, 4)):
        write_trial(study_dir, "base", seed, damaged(refs, every), refs)
        write_trial(study_dir, "heads_1", seed, damaged(refs, 1), refs)
    for seed in (1, 2):
        train_file = study_dir / "trials" / f"heads_1-seed{seed}" / "train.json"
        train_file.write_text(json.dumps({**json.loads(train_file.read_text()), "world_size": 2}))
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir), refs)}
    base, heads_1 = rows["base"], rows["heads_1"]
    assert heads_1.conditions.hardware == f"{base.conditions.hardware}, 2 processes"
    assert not heads_1.comparable and heads_1.welch_p is None


def test_a_trial_resumed_on_another_hardware_class_matches_neither(study):
    _, study_dir = study
    run_file = study_dir / "trials" / "base-seed1" / sweep.RUN_FILE
    run = json.loads(run_file.read_text())
    run["attempts"].insert(0, {"outcome": "preempted", "hardware": "NVIDIA H200 x 1"})
    run_file.write_text(json.dumps(run))
    record = next(r for r in report.load_records(study_dir) if (r.variant, r.seed) == ("base", 1))
    assert record.conditions.hardware == "AMD EPYC, avx512_bf16 + NVIDIA H200"


def test_aa_check_and_power_statement(five_seed_study):
    spec, study_dir, refs = five_seed_study
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    base = next(r for r in rows if r.variant == "base").test_bleu
    aa = report.aa_check(rows)
    assert "the base's 5 seeds (one config) split into two groups in all 10 ways" in aa
    splits = [welch_p([base[i] for i in group], [base[i] for i in range(5) if i not in group])
              for group in itertools.combinations(range(5), 2)]  # fmt: skip
    rejected = sum(p <= 0.05 for p in splits)
    assert f"Welch's test calls them different in {rejected} of the 10 tested " in aa
    assert f"(false-positive rate {rejected / 10:.2f} at α = 0.05 before Holm's" in aa
    assert f"smallest p {min(splits):.3f})." in aa
    power = report.power_statement(spec, rows)
    sd = statistics.stdev(base)
    assert f"SD on test2016 is {sd:.2f} BLEU" in power
    # six comparisons: Holm's strictest step is 0.05 / 6
    cells = []
    for alpha in (0.05, 0.05 / 6):
        d = seed_stats.detectable_difference(sd, 5, alpha=alpha)
        cells.append(f"{d:.2f} BLEU ({d / sd:.2f} SD) at α = {alpha:.4f}")
    assert "Welch's test detects, with 5 seeds a side, " + " and ".join(cells) + "." in power
    assert "Holm's strictest step over the spec's 6 comparisons" in power
    assert "cannot fall below p = 0.0079 at 5 seeds a side" in power


def test_aa_check_without_a_test_says_why(five_seed_study):
    """Two seeds of the base split one against one, or five that score alike: no Welch test,
    so no call and no rate, with the reason."""
    spec, study_dir, refs = five_seed_study
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    for scores, reason in (([38.4, 37.1], seed_stats.SINGLE_RUN),
                           ([37.1] * 5, seed_stats.NO_SPREAD)):  # fmt: skip
        rows[0] = dataclasses.replace(rows[0], test_bleu=scores, seeds=list(range(len(scores))))
        aa = report.aa_check(rows)
        assert f"Welch's test makes no call ({reason})" in aa and "rate" not in aa


def test_power_statement_of_a_base_whose_seeds_score_alike(five_seed_study):
    """Seeds of the base with one score (a degenerate smoke model): no spread to size a
    difference against, said as such rather than a division by zero."""
    spec, study_dir, refs = five_seed_study
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    rows[0] = dataclasses.replace(rows[0], test_bleu=[37.1] * 5, seeds=list(range(5)))
    assert rows[0].variant == "base"
    power = report.power_statement(spec, rows)
    assert "the base's 5 seeds score the same test2016 BLEU (37.10)" in power


def test_perplexities_logged_as_batch_means_are_marked_as_such(study, references):
    spec, study_dir = study
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    low, high = stats.t.interval(0.95, 1, loc=11.5, scale=stats.sem([11.0, 12.0]))
    cell = f"11.50 [{low:.2f}, {high:.2f}]"
    assert f"| base | {cell} |" in report.ppl_table(rows) and "†" not in report.ppl_table(rows)
    assert report.ppl_note(rows).endswith("perplexity per target subword.")
    # the base's records as made before TokenMean: no `loss_average`
    for run_file in study_dir.glob(f"trials/base-seed*/{sweep.RUN_FILE}"):
        run = json.loads(run_file.read_text())
        run_file.write_text(json.dumps({k: v for k, v in run.items() if k != "loss_average"}))
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    assert f"| base | {cell} † |" in report.ppl_table(rows)
    assert f"| heads_1 | {cell} | +0.00 [" in report.ppl_table(rows)
    assert "except where marked †" in report.ppl_note(rows)


@pytest.mark.parametrize(
    ("base_ppl", "heads_1_ppl", "paper_ppl", "verdict"),
    [
        # every seed apart yet two seeds a side with this spread: no significant difference
        ((11.0, 12.0), (13.0, 14.0), 0.29, "val PPL +2.00 vs the paper's +0.29: cannot tell"),
        ((11.0, 11.01), (13.0, 13.01), 0.29, "val PPL +2.00 vs the paper's +0.29: holds"),
        ((11.0, 11.01), (13.0, 13.01), -0.29, "val PPL +2.00 vs the paper's -0.29: contradicts"),
        ((11.0, 11.01), (9.0, 9.01), 0.0, "val PPL -2.00 vs the paper's +0.00: contradicts"),
        ((11.0, 11.01), (9.0, 9.01), None, "val PPL -2.00: differs"),
    ],
)
def test_findings_judge_the_perplexity_like_bleu(
    study, references, base_ppl, heads_1_ppl, paper_ppl, verdict
):
    """Val perplexity gets the BLEU's test: Welch over seeds, Holm across the comparisons,
    the verdict from that alone (never from the seeds merely not overlapping)."""
    spec, study_dir = study
    if paper_ppl is None:
        del spec.paper["heads_1"]["ppl"]
    else:
        spec.paper["heads_1"]["ppl"] = paper_ppl
    for variant, values in (("base", base_ppl), ("heads_1", heads_1_ppl)):
        for seed, ppl in zip((1, 2), values):
            train = study_dir / "trials" / f"{variant}-seed{seed}" / "train.json"
            last = {"val/ppl": ppl}
            train.write_text(json.dumps({**json.loads(train.read_text()), "last": last}))
    rows = report.variant_rows(spec, report.load_records(study_dir), references)
    heads_1 = next(line for line in report.findings(rows) if line.startswith("- heads_1"))
    assert verdict in heads_1
    assert f"(Welch p = {welch_p(list(heads_1_ppl), list(base_ppl)):.3f}, Holm p = " in heads_1


@pytest.mark.slow
def test_report_files_and_readme_block(study, tmp_path):
    spec, study_dir = study
    path = report.write_report(spec, study_dir, log_to_wandb=False)
    text = path.read_text()
    assert "| base | (base recipe) | 1.00 M | 31.50 ± 0.71 |" in text
    assert "| base | 11.50 [" in text  # the val PPL table
    assert "| heads_1 | model.heads=1 |" in text and "-0.6 (PPL +0.29), (A) h=1 vs h=4 |" in text
    assert "| cannot tell |" in text and "A/A check: the base's 2 seeds" in text
    assert "**In short**" in text and "Are 2 seeds enough?" in text
    assert "Study `smoke`: 5 of 6 trials finished" in text
    for chart in ("bleu_per_variant", "learning_curves"):
        image = matplotlib.image.imread(study_dir / report.CHARTS[chart])
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert f"({report.CHARTS[chart]})" in text

    page, readme = tmp_path / report.study_page(spec.study), tmp_path / "README.md"
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
    # a study README names by its progress alone: one line, the tables on its page
    progress_begin, progress_end = docs_blocks.markers(f"{report.block_name(spec.study)}:progress")
    readme.write_text(f"# R\n\n{progress_begin}\nold\n{progress_end}\n")
    report.update_docs(spec, study_dir, tmp_path)
    assert docs_blocks.read(readme, f"{report.block_name(spec.study)}:progress") == (
        f"{len(report.load_records(study_dir))} of {len(spec.grid())} trials finished.\n"
    )


def test_references_are_the_prepared_test_split(study, references):
    spec, _ = study
    assert report.test_references(spec) == references


def test_no_finished_trial_is_a_clear_error(tmp_path):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    with pytest.raises(PipelineError, match="no finished trials of study 'smoke'"):
        report.write_report(spec, tmp_path / "smoke", log_to_wandb=False)


@pytest.mark.parametrize(
    "study_name", ["table3", "table3_label_smoothing", "table3_seeds", "table3_bc"]
)
def test_the_docs_ablation_block_is_the_reports_output(study_name):
    """Each committed study's page, docs/ablation-<study>.md (and README's summary or progress
    line, where README has one), is exactly what `python -m pipeline.report <study> --update-docs` makes of
    the committed records."""
    spec = sweep.load_spec(REPO_ROOT / f"ablations/{study_name}.yaml")
    study_dir = REPO_ROOT / sweep.RESULTS_ROOT / spec.study
    page, name = REPO_ROOT / report.study_page(spec.study), report.block_name(spec.study)
    assert docs_blocks.read(page, name) == report.docs_block(spec, study_dir, page)
    readme = REPO_ROOT / "README.md"
    if docs_blocks.markers(f"{name}:summary")[0] in readme.read_text():
        summary = report.summary_block(spec, study_dir, page)
        assert docs_blocks.read(readme, f"{name}:summary") == summary
    if docs_blocks.markers(f"{name}:progress")[0] in readme.read_text():
        progress = report.progress_block(spec, study_dir)
        assert docs_blocks.read(readme, f"{name}:progress") == progress
        assert progress.count("\n") == 1 and " trials finished" in progress


def test_transfer_table_shows_where_each_finding_holds_per_language_pair(
    tmp_path, references, five_seed_study
):
    spec, study_dir, refs = five_seed_study
    de_en = dataclasses.replace(
        spec,
        study="smoke_de_en",
        budget={**spec.budget, "data.src_lang": "de", "data.tgt_lang": "en"},
    )
    assert (report.pair_label(spec), report.pair_label(de_en)) == ("en→de", "de→en")
    english = report.test_references(de_en)[:200]
    assert english != refs
    de_en_dir = tmp_path / "results" / de_en.study
    # de->en: heads_1 as the base (cannot tell), heads_8 below it (contradicts, as on en->de)
    for variant in ("base", "heads_1", "heads_8"):
        damage = FIVE_SEEDS["heads_16" if variant == "heads_1" else variant]
        for seed, (every, offset) in enumerate(damage, start=1):
            write_trial(de_en_dir, variant, seed, damaged(english, every, offset), english)
    pairs = [
        ("en→de", report.variant_rows(spec, report.load_records(study_dir), refs)),
        ("de→en", report.variant_rows(de_en, report.load_records(de_en_dir), english)),
    ]
    table = report.transfer_table(pairs).splitlines()
    assert (
        table[0] == "| variant | paper Δ BLEU | en→de: Δ, verdict | de→en: Δ, verdict | holds on |"
    )
    rows = {line.split(" | ")[0]: line for line in table[2:]}
    de_en_rows = {r.variant: r for r in pairs[1][1]}
    en_de_rows = {r.variant: r for r in pairs[0][1]}
    assert rows["| heads_1"] == (
        f"| heads_1 | -0.6 | {en_de_rows['heads_1'].delta:+.2f}, holds | "
        f"{de_en_rows['heads_1'].delta:+.2f}, cannot tell | en→de |"
    )
    assert rows["| heads_8"].endswith(", contradicts | none |")
    assert rows["| dropout_0.0"] == (
        f"| dropout_0.0 | -1.2 | {en_de_rows['dropout_0.0'].delta:+.2f}, cannot tell (not "
        "compared) | - | none |"
    )


def test_transfer_study_without_records_is_a_clear_error(tmp_path):
    """Named before any scoring: exit 2, the study and the folder, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.report", "table3_label_smoothing", "--no-wandb",
         "--results-dir", str(REPO_ROOT / sweep.RESULTS_ROOT), "--transfer", "table3_de_en"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--transfer table3_de_en: no finished trials in" in done.stderr
    assert "Traceback" not in done.stderr


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])")


def committed_records(study_dir):
    """The committed records, read here without pipeline.report."""
    by_variant = {}
    for run_file in sorted(study_dir.glob(f"trials/*/{sweep.RUN_FILE}")):
        run = json.loads(run_file.read_text())
        folder = run_file.parent
        by_variant.setdefault(run["params"]["variant"], []).append(
            {
                "seed": run["params"]["seed"],
                "test": json.loads((folder / "eval.json").read_text())[SPLIT]["bleu_lc"],
                "val": json.loads((folder / "eval.json").read_text())["val"]["bleu_lc"],
                "ppl": json.loads((folder / "train.json").read_text())["last"]["val/ppl"],
                "ran_at": (run["commit"], run["precision"], run["hardware"].split(", ")[0]),
                "hyps": (folder / f"{SPLIT}.hyp").read_text().splitlines(),
            }
        )
    return {v: sorted(rs, key=lambda r: r["seed"]) for v, rs in by_variant.items()}


def fmt(*values, digits=(2,), signed=False) -> set[str]:
    out = set()
    for value in values:
        for d in digits:
            out.add(f"{value:+.{d}f}" if signed else f"{value:.{d}f}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("study_name", ["table3", "table3_label_smoothing"])
def test_committed_report_prose_is_made_from_the_records(study_name):
    """The committed report.md is what the report command makes of the committed records, and
    every number of its prose (findings, summary, A/A check, power) is computed here again
    from the record files."""
    from pipeline.evaluation import scoring, seed_stats

    spec = sweep.load_spec(REPO_ROOT / f"ablations/{study_name}.yaml")
    study_dir = REPO_ROOT / sweep.RESULTS_ROOT / spec.study
    text = report.markdown(spec, study_dir)
    assert (study_dir / "report.md").read_text() == f"# Ablation study `{spec.study}`\n\n{text}"

    records = committed_records(study_dir)
    base = records["base"]
    base_test = [r["test"] for r in base]
    base_mean = statistics.fmean(base_test)
    references = report.test_references(spec)
    alpha = seed_stats.ALPHA
    compared = {
        v: rs for v, rs in records.items()
        if v != "base" and {r["ran_at"] for r in rs} == {r["ran_at"] for r in base}
        and len({r["ran_at"] for r in base}) == 1
    }  # fmt: skip
    # Welch's p by scipy (the committed comparisons have two or more seeds a side, with spread)
    seed_p = {v: welch_p([r["test"] for r in rs], base_test) for v, rs in compared.items()}
    permutation_p = {v: seed_stats.permutation_test([r["test"] for r in rs], base_test)
                     for v, rs in compared.items()}  # fmt: skip
    # one Holm family: every comparison the spec plans with the base, one not made as p = 1
    family = [v for v in spec.variants if v != "base"]
    holm = dict(zip(family, seed_stats.holm([seed_p.get(v) for v in family])))
    # val PPL: the same test and family on the other measure
    base_ppl = [r["ppl"] for r in base]
    ppl_p = {v: welch_p([r["ppl"] for r in rs], base_ppl) for v, rs in compared.items()}
    ppl_holm = dict(zip(family, seed_stats.holm([ppl_p.get(v) for v in family])))
    # the level each comparison's Holm step faces: alpha / (m - its rank by p), no p last
    ranked = sorted(family, key=lambda v: seed_p.get(v, 1.0))
    step = {v: alpha / (len(family) - rank) for rank, v in enumerate(ranked)}
    detectable = {}
    for v in seed_p:
        test = [r["test"] for r in compared[v]]
        spread = ((statistics.variance(test) + statistics.variance(base_test)) / 2) ** 0.5
        n = min(len(test), len(base_test))
        detectable[v] = seed_stats.detectable_difference(spread, n, alpha=step[v])
    lines = text.splitlines()
    checked = 0
    for variant, rs in records.items():
        if variant == "base":
            continue
        line = next(line for line in lines if line.startswith(f"- {variant}:"))
        delta = statistics.fmean(r["test"] for r in rs) - base_mean
        paper = spec.paper.get(variant, {})
        allowed = fmt(delta, signed=True) | fmt(paper.get("bleu", 0), digits=(1,), signed=True)
        allowed |= _unlike_numbers(spec, variant)
        if variant in compared:
            by_seed = {r["seed"]: r for r in base}
            pairs = [(by_seed[r["seed"]]["hyps"], r["hyps"]) for r in rs]
            sentence_p = scoring.pooled_paired_bootstrap(pairs, references)
            ppl_delta = statistics.fmean(r["ppl"] for r in rs) - statistics.fmean(
                r["ppl"] for r in base
            )
            allowed |= {str(len(rs)), str(len(base))} | fmt(
                seed_p[variant], holm[variant], permutation_p[variant], sentence_p, digits=(3,)
            )
            allowed |= fmt(ppl_delta, paper.get("ppl", 0), signed=True)
            allowed |= fmt(ppl_p[variant], ppl_holm[variant], digits=(3,))
            word = report.verdict(delta, holm[variant], paper)
            assert f": {word}" in line
            if word == report.CANNOT_TELL:  # beside it, what the seeds would have detected
                allowed |= fmt(detectable[variant]) | fmt(step[variant], digits=(4,)) | {"80"}
                assert f"detects {detectable[variant]:.2f} BLEU with 80% power" in line
            ppl_word = report.direction_verdict(ppl_delta, ppl_holm[variant], paper.get("ppl"))
            assert f": {ppl_word} (Welch p = {ppl_p[variant]:.3f}, Holm p =" in line
        else:
            assert ": cannot tell, not compared: it ran under other run conditions" in line
        assert set(NUMBER.findall(line)) <= allowed, (line, allowed)
        checked += 1
    assert checked == len(records) - 1

    summary = next(line for line in lines if line.startswith("**In short**"))
    deltas = [statistics.fmean(r["test"] for r in rs) - base_mean
              for v, rs in records.items() if v != "base"]  # fmt: skip
    assert set(NUMBER.findall(summary)) <= fmt(*deltas, signed=True) | {str(alpha)}

    # the findings in prose: the differences, their Welch intervals (scipy's), the paper's
    # rows, what is not the same change, and beside each 'cannot tell' what was detectable
    differs = next(line for line in lines if line.startswith("**What differs"))
    intervals = [stats.ttest_ind([r["test"] for r in rs], base_test, equal_var=False)
                 .confidence_interval() for rs in compared.values()]  # fmt: skip
    allowed = fmt(*deltas, *(end for i in intervals for end in i), signed=True)
    allowed |= fmt(*detectable.values()) | {str(len(family)), str(alpha), "95", "80"}
    for variant in compared:
        allowed |= _unlike_numbers(spec, variant) | set(NUMBER.findall(spec.paper.get(
            variant, {}).get("rows", ""))) | fmt(spec.paper.get(variant, {}).get("bleu", 0),
                                                 digits=(1,), signed=True)  # fmt: skip
    assert set(NUMBER.findall(differs)) <= allowed, differs

    # the label-smoothing write-up against the runs without smoothing, where they were compared
    write_up = [line for line in lines if line.startswith("**Beside another write-up**")]
    none = [v for v in compared if spec.variants[v] == {"train.label_smoothing": 0.0}]
    assert len(write_up) == len(none)
    for line in write_up:
        rs = compared[none[0]]
        allowed = {"0.1", "0.0", "+5.8", "+4.8"}
        for key in ("val", "test", "ppl"):
            smoothed, plain = [r[key] for r in base], [r[key] for r in rs]
            low, high = stats.ttest_ind(smoothed, plain, equal_var=False).confidence_interval()
            allowed |= fmt(statistics.fmean(smoothed) - statistics.fmean(plain), low, high,
                           signed=True)  # fmt: skip
        allowed |= fmt(ppl_holm[none[0]], digits=(3,))
        assert set(NUMBER.findall(line)) <= allowed, line

    aa = next(line for line in lines if line.startswith("A/A check"))
    n = len(base_test)
    groups = [g for g in itertools.combinations(range(n), n // 2) if n % 2 or 0 in g]
    splits = [welch_p([base_test[i] for i in g], [base_test[i] for i in range(n) if i not in g])
              for g in groups if min(len(g), n - len(g)) > 1]  # fmt: skip
    rejected = sum(p <= alpha for p in splits)
    allowed = {str(n), str(len(groups)), str(alpha)}
    if splits:
        allowed |= {str(len(splits)), str(rejected), f"{rejected / len(splits):.2f}",
                    f"{min(splits):.3f}"}  # fmt: skip
    else:  # no split has two seeds a side: no call
        assert "Welch's test makes no call" in aa
    assert set(NUMBER.findall(aa)) <= allowed, aa

    power = next(line for line in lines if line.startswith("Are "))
    sd = statistics.stdev(base_test)
    m = len(spec.variants) - 1
    seeds = {len(base), len(spec.seeds)}
    detectable = [seed_stats.detectable_difference(sd, n, alpha=a)
                  for n in seeds for a in (alpha, alpha / m)]  # fmt: skip
    assert set(NUMBER.findall(power)) <= (
        {str(n) for n in (*seeds, m)}
        | fmt(sd, *detectable, *(d / sd for d in detectable))
        | fmt(alpha, alpha / m, *(seed_stats.smallest_p(n, n) for n in seeds), digits=(4,))
        | {f"{seed_stats.POWER:.0%}".rstrip("%")}
    ), power


def _unlike_numbers(spec, variant: str) -> set[str]:
    """The numbers a finding may give for how the variant's change differs from the paper's
    row: the settings of our base, the variant and the paper's base model (conf/model/base.yaml)
    and, for a count of heads, the head widths and their ratio; the row's own label."""
    from pipeline import config

    if variant not in spec.paper:
        return set()
    ours, changed = sweep.point_config(spec, {}), sweep.point_config(spec, spec.variants[variant])
    paper = config.compose(["~experiment", "model=base"])
    numbers = set(NUMBER.findall(spec.paper[variant]["rows"]))
    for key in spec.variants[variant]:
        section, name = key.split(".")
        values = [getattr(getattr(cfg, section), name) for cfg in (ours, changed, paper)]
        numbers |= {str(v) for v in values}
        if key == "model.heads":
            d, wide, h = ours.model.d_model, paper.model.d_model, changed.model.heads
            numbers |= {str(d), str(wide), f"{d / h:g}", f"{wide / h:g}", f"{wide / d:g}"}
    return numbers


def test_verdicts_on_the_committed_records_are_the_seed_level_tests():
    """The records' sentence bootstrap called heads_1 (-0.95), label_smoothing_0.0 (-0.99) and
    learned_positions (-0.71) significant; two seeds a side (or another commit) cannot tell.
    Holm's family is the spec's ten comparisons, the nine not made count as p = 1."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/table3.yaml")
    text = report.markdown(spec, REPO_ROOT / sweep.RESULTS_ROOT / spec.study, with_states=False)
    lines = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    assert (
        "-0.95 BLEU (2 vs 2 seeds; Welch p = 0.468, Holm p = 1.000; exact permutation p = 0.667"
        in (lines["- heads_1"])
    )
    assert (
        "vs the paper's -0.6 (not the same change: at d_model 128 a head is 128/1 = 128 wide, 4 "
        "times narrower than the paper's 512/1 = 512 at the same h): cannot tell ("
        in lines["- heads_1"]
    )
    for variant, delta in (("label_smoothing_0.0", "-0.99"), ("learned_positions", "-0.71")):
        assert f"{delta} BLEU vs the paper's" in lines[f"- {variant}"]
        assert "cannot tell, not compared" in lines[f"- {variant}"]
    assert "holds" not in text.split("A/A check")[1]


def test_specs_ready_to_run_the_powered_grid_the_full_budget_rows_and_a_second_pair():
    table3 = sweep.load_spec(REPO_ROOT / "ablations/table3.yaml")
    seeds = sweep.load_spec(REPO_ROOT / "ablations/table3_seeds.yaml")
    assert seeds.seeds == [1, 2, 3, 4, 5] and len(seeds.grid()) == 55
    assert (seeds.variants, seeds.budget, seeds.paper) == (
        table3.variants,
        table3.budget,
        table3.paper,
    )
    full = sweep.load_spec(REPO_ROOT / "ablations/table3_full_budget.yaml")
    assert list(full.variants) == ["base", "dropout_0.1", "dropout_0.5", "learned_positions"]
    assert full.seeds == seeds.seeds
    recipe = sweep.point_config(dataclasses.replace(full, budget={}), {"seed": 1})
    cfg = sweep.point_config(full, {"seed": 1})
    assert cfg.train.max_steps == 7000 and cfg == recipe  # the recipe's own schedule
    de_en = sweep.load_spec(REPO_ROOT / "ablations/table3_de_en.yaml")
    assert de_en.variants == seeds.variants and de_en.seeds == seeds.seeds
    assert {k: v for k, v in de_en.budget.items() if not k.startswith("data.")} == table3.budget
    assert report.pair_label(de_en) == "de→en" and report.pair_label(seeds) == "en→de"
    assert len({s.study for s in (table3, seeds, full, de_en)}) == 4


def spec_comments(study: str) -> str:
    """A committed spec's text as one line of words, comment marks dropped."""
    return " ".join((REPO_ROOT / f"ablations/{study}.yaml").read_text().replace("#", "").split())


def test_spec_comments_state_what_five_seeds_detect():
    """The specs' comments on what five seeds can tell are the detectable differences of
    Welch's test with Holm's strictest step over each spec's comparisons, and at the spread of
    table3's committed base seeds."""
    detect = seed_stats.detectable_difference
    seeds = sweep.load_spec(REPO_ROOT / "ablations/table3_seeds.yaml")
    m = len(seeds.variants) - 1
    per_comparison, strictest = detect(1.0, 5), detect(1.0, 5, alpha=0.05 / m)
    base = committed_records(REPO_ROOT / sweep.RESULTS_ROOT / "table3")["base"]
    sd = statistics.stdev(r["test"] for r in base)
    text = spec_comments("table3_seeds")
    assert (
        f"with Holm's correction over the {m} comparisons with the base. With 80% power it detects a "
        f"difference of {per_comparison:.1f} seed-level SDs per comparison and {strictest:.1f} "
        f"SDs at Holm's strictest step (0.05 / {m}); at the spread of table3's two base seeds "
        f"(SD {sd:.2f} BLEU) that is {per_comparison * sd:.1f} and {strictest * sd:.1f} BLEU"
    ) in text
    full = sweep.load_spec(REPO_ROOT / "ablations/table3_full_budget.yaml")
    m = len(full.variants) - 1
    text = spec_comments("table3_full_budget")
    assert (
        f"Holm's strictest step is 0.05 / {m}, where five seeds detect "
        f"{detect(1.0, 5, alpha=0.05 / m):.1f} seed-level SDs with 80% power "
        f"({per_comparison:.1f} per comparison)"
    ) in text


def test_a_pinned_study_still_running_shows_interim_estimates_and_its_progress(
    tmp_path, references
):
    """A pinned study reports its pinned trials only; a trial run elsewhere (--allow-mixed) is
    shown apart; until every planned seed has finished there is no test and no verdict, and the
    progress says what is done per variant and how many hours are left."""
    import optuna

    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.seeds = [1, 2, 3]
    spec.settings.trial_minutes_estimate = 90
    refs = references[:200]
    study_dir = tmp_path / "results" / spec.study
    storage = f"sqlite:///{study_dir / 'study.db'}"
    study_dir.mkdir(parents=True)
    pin = {"commit": "abc1234", "hardware": "AMD EPYC, avx512_bf16", "precision": "bf16-mixed"}
    optuna.create_study(study_name=spec.study, storage=storage).set_user_attr("pin", pin)
    hours = {("base", 1): 0.5, ("base", 2): 0.7, ("heads_1", 1): 1.0}
    for (variant, seed), spent in hours.items():
        write_trial(study_dir, variant, seed, damaged(refs, 2 + seed), refs)
        run_file = study_dir / "trials" / f"{variant}-seed{seed}" / sweep.RUN_FILE
        run = json.loads(run_file.read_text())
        run.update(train_wall_time_s=spent * 3600 - 60, eval_wall_time_s=60)
        run_file.write_text(json.dumps(run))
    elsewhere = {**RAN_AT, "commit": "fedcba9"}
    write_trial(study_dir, "heads_1", 2, damaged(refs, 5), refs, elsewhere)

    pinned = report.study_pin(spec, study_dir)
    assert pinned == report.RunConditions("abc1234", "AMD EPYC, avx512_bf16", "bf16-mixed")
    every_row = report.variant_rows(spec, report.load_records(study_dir), refs, pinned)
    rows = {r.variant: r for r in every_row if r.conditions == pinned}
    assert [r.seeds for r in every_row if r.conditions != pinned] == [[2]]
    assert rows["heads_1"].seeds == [1] and rows["base"].seeds == [1, 2]
    assert all(r.interim and r.welch_p is None and r.holm_p is None for r in rows.values())
    assert rows["heads_1"].verdict is None
    # the charts' titles say so: 3 of the 6 planned trials at the pin
    assert report.study_state(spec, every_row) == ", interim, 3 of 6"
    text = report.markdown(spec, study_dir, with_states=False)
    assert "3 of 6 planned trials finished at the study's pin (its commit" in text
    assert "| commit abc1234, AMD EPYC, avx512_bf16, bf16-mixed (the pin) | 3 |" in text
    assert "1 more ran elsewhere and are shown apart" in text
    assert "| base | 2 of 3 (1, 2) | 0.60 [0.50, 0.70] |" in text
    assert "| heads_1 | 1 of 3 (1) | 1.00 [1.00, 1.00] |" in text
    # left: base seed 3 at its median 0.6 h, heads_1 seeds 2 and 3 at its 1.0 h
    assert "About 2.6 hours of one worker are left (1.3 h with two side by side)" in text
    assert f"| {report.INTERIM} |" in text and "| commit fedcba9, AMD EPYC" in text
    assert "the study is still running; its verdicts" in text


def test_readmes_table3_sentence_states_the_studys_own_design():
    """The numbers README's Table 3 paragraph states are the spec's: its trials, seeds and the
    size of its Holm family."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/table3_seeds.yaml")
    text = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"{len(spec.grid())} trials pinned to one commit" in text
    assert f"over the study's {report.family_size(spec)} comparisons with the base" in text
    assert f"{NUMBER_WORDS[len(spec.seeds)]} seeds each" in text


def _run_records(study_name: str) -> list[dict]:
    return [r.run for r in report.load_records(REPO_ROOT / RESULTS_ROOT / study_name)]


def _study_page(study_name: str) -> str:
    """The study's docs page, docs/ablation-<study>.md, its whitespace folded."""
    return " ".join((REPO_ROOT / report.study_page(study_name)).read_text().split())


def test_the_results_pages_account_of_the_pilots_conditions_is_its_records():
    """The two-seed pilot's page (its trials, the commits and CPU classes they ran at, the days
    its attempts spanned in its Optuna storage) and the label-smoothing study's (its trials, all
    on one GPU in bf16-mixed)."""
    pilot = _run_records("table3")
    commits = {run["commit"] for run in pilot}
    classes = {hardware_class(run["hardware"]) for run in pilot}
    storage = REPO_ROOT / RESULTS_ROOT / "table3" / "study.db"
    with contextlib.closing(sqlite3.connect(f"file:{storage}?mode=ro", uri=True)) as db:
        first, last = db.execute(
            "SELECT min(datetime_start), max(datetime_complete) FROM trials"
        ).fetchone()
    span = datetime.datetime.fromisoformat(last) - datetime.datetime.fromisoformat(first)
    page = _study_page("table3")
    assert f"with two seeds each ({len(pilot)} trials)" in page
    assert (
        f"Its trials ran at {NUMBER_WORDS[len(commits)]} commits on "
        f"{NUMBER_WORDS[len(classes)]} CPU classes (their retries spread it over "
        f"{NUMBER_WORDS[round(span / datetime.timedelta(days=1))]} days)"
    ) in page

    smoothing = _run_records("table3_label_smoothing")
    ((hardware, precision),) = {(run["hardware"], run["precision"]) for run in smoothing}
    assert hardware.endswith(" x 1") and "NVIDIA" in hardware
    assert f"Its {len(smoothing)} trials ran on one GPU ({precision};" in _study_page(
        "table3_label_smoothing"
    )


def test_the_results_pages_reading_of_power_and_budget_is_computed():
    """The studies' pages outside their blocks: the seed-level SDs two seeds a side detect
    (the pilot), what five seeds detect at table3_seeds' base spread, per comparison and at
    Holm's strictest step, and the study's peak learning rate, the same as the recipe's."""
    from pipeline import config
    from pipeline.training.module import inverse_sqrt_rate

    detect = seed_stats.detectable_difference
    assert (
        f"Welch's test detects only differences of about "
        f"{NUMBER_WORDS[round(detect(1.0, 2))]} seed-level SDs"
    ) in _study_page("table3")
    spec = sweep.load_spec(REPO_ROOT / "ablations/table3_seeds.yaml")
    base = committed_records(REPO_ROOT / RESULTS_ROOT / spec.study)["base"]
    assert len(base) == len(spec.seeds), "the base's seeds are all in"
    sd = statistics.stdev(r["test"] for r in base)
    strictest = seed_stats.ALPHA / report.family_size(spec)
    smoothing = sorted(abs(spec.paper[v]["bleu"]) for v in spec.paper if "smoothing" in v)
    assert (
        f"five seeds detect, with {seed_stats.POWER:.0%} power, about "
        f"{detect(sd, len(spec.seeds)):.1f}-{detect(sd, len(spec.seeds), alpha=strictest):.1f} "
        f"BLEU (one comparison, Holm's strictest step): the paper's label-smoothing differences, "
        f"{' and '.join(f'{d:.1f}' for d in smoothing)} BLEU, are far below that, so five seeds "
        "cannot detect them"
    ) in _study_page("table3_label_smoothing")
    assert max(smoothing) < detect(sd, len(spec.seeds))

    def peak_rate(overrides: list[str]) -> str:
        cfg = config.compose([f"experiment={spec.base_experiment}", *overrides])
        train = cfg.train
        rate = inverse_sqrt_rate(train.warmup_steps, d_model=cfg.model.d_model,
                                 warmup_steps=train.warmup_steps, factor=train.lr_factor)  # fmt: skip
        return f"{rate:.4f}"

    study = peak_rate([f"{key}={value}" for key, value in spec.budget.items()])
    assert study == peak_rate([])
    warmup = spec.budget["train.warmup_steps"]
    assert f"(the same {study} peak rate after {warmup} warm-up" in _study_page(spec.study)


def _hypotheses_hashes(folder) -> tuple[str, str]:
    """SHA-256 of a trial record's test2016 and val hypotheses."""
    return tuple(
        hashlib.sha256((folder / f"{split}.hyp").read_bytes()).hexdigest()
        for split in (SPLIT, "val")
    )


def test_the_pilots_twins_in_the_five_seed_study_are_named_from_their_hypotheses_hashes():
    """The pilot's page: its seeds that the five-seed study ran again on the
    same hardware class at another commit wrote byte-identical hypotheses (computed here from
    the committed files); those run on another class did not."""
    pilot = {
        (r.variant, r.seed): r for r in report.load_records(REPO_ROOT / RESULTS_ROOT / "table3")
    }
    seeds = {(r.variant, r.seed): r
             for r in report.load_records(REPO_ROOT / RESULTS_ROOT / "table3_seeds")}  # fmt: skip
    named = [(variant, seed) for variant in ("base", "heads_1", "heads_16", "dropout_0.0")
             for seed in (1, 2)]  # fmt: skip
    for point in named:
        before, again = pilot[point], seeds[point]
        assert before.conditions.hardware == again.conditions.hardware == "AMD EPYC, avx512_bf16"
        assert before.conditions.commit != again.conditions.commit
        assert _hypotheses_hashes(before.folder) == _hypotheses_hashes(again.folder), point
    # the same seed on another hardware class is not the same run
    for point in set(pilot) & set(seeds):
        if pilot[point].conditions.hardware != seeds[point].conditions.hardware:
            assert _hypotheses_hashes(pilot[point].folder) != _hypotheses_hashes(
                seeds[point].folder
            )
    page = _study_page("table3")
    assert (
        "Seeds 1 and 2 of base, heads_1, heads_16 and dropout_0.0 ran here on the five-seed "
        "study's hardware class (AMD EPYC, avx512_bf16) at other commits, and wrote test2016 and "
        "val hypotheses byte-identical to that study's runs of the same seed"
    ) in page
    assert "why the two studies' trials are never pooled" in page


def test_a_study_on_a_database_server_is_pinned_by_the_file_its_workers_write(tmp_path, references):
    """No study.db in its results folder (its storage is a server): the report reads the pin
    the workers wrote beside the records, and draws no verdict before every trial finished."""
    from pipeline.sweep import pin as sweep_pin

    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.seeds = [1, 2, 3]
    refs = references[:200]
    study_dir = tmp_path / "results" / spec.study
    for variant, seed in (("base", 1), ("base", 2), ("heads_1", 1), ("heads_1", 2)):
        write_trial(study_dir, variant, seed, damaged(refs, 2 + seed), refs)
    assert report.study_pin(spec, study_dir) is None  # no pin written: not pinned
    pin = {"commit": "abc1234", "hardware": "AMD EPYC, avx512_bf16", "precision": "bf16-mixed"}
    sweep_pin.write_pin_file(study_dir, sweep_pin.Pin(**pin))
    pinned = report.study_pin(spec, study_dir)
    assert pinned == report.RunConditions(**pin)
    rows = report.variant_rows(spec, report.load_records(study_dir), refs, pinned)
    assert [(r.variant, r.seeds) for r in rows] == [("base", [1, 2]), ("heads_1", [1, 2])]
    assert len(spec.grid()) == 6  # 4 of 6 planned trials finished
    assert all(r.interim and r.welch_p is None and r.verdict is None for r in rows)


def test_the_set_aside_table3_bc_trials_equal_their_reruns_at_the_pin_as_their_readme_says():
    """table3_bc's trials set aside (a pin whose commit was lost) and the same seeds run again at
    the study's pin on the same class: byte-identical hypotheses, as the set-aside README says."""
    study_dir = REPO_ROOT / RESULTS_ROOT / "table3_bc"
    aside = {(r.variant, r.seed): r for r in report.load_records(study_dir / "set-aside")}
    pinned = {(r.variant, r.seed): r for r in report.load_records(study_dir)}
    named = [("base", seed) for seed in (1, 2, 3, 4)]
    for point in named:
        before, again = aside[point], pinned[point]
        assert before.conditions.hardware == again.conditions.hardware
        assert before.conditions.commit != again.conditions.commit
        assert _hypotheses_hashes(before.folder) == _hypotheses_hashes(again.folder), point
    readme = " ".join((study_dir / "set-aside" / "README.md").read_text().split())
    assert "base seeds 1-4 wrote test2016 and val hypotheses byte-identical to these" in readme


# (every, offset) per seed of a complete study: heads_1, dropout_0.0 and no label smoothing
# damage more sentences than any seed of the base (no label smoothing fewer than the others);
# heads_16 as many as the base, other ones
COMPLETE = {
    "base": [(4, 0), (5, 0), (6, 0), (7, 0), (8, 0)],
    "heads_1": [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    "heads_16": [(4, 1), (5, 1), (6, 1), (7, 1), (8, 1)],
    "dropout_0.0": [(2, 1), (3, 0), (2, 0), (3, 2), (3, 1)],
    "label_smoothing_0.0": [(3, 0), (4, 1), (3, 1), (4, 2), (3, 2)],
}


@pytest.fixture
def complete_study(tmp_path, references):
    """Every planned trial of a five-seed grid finished; the base's dropout is 0.3 (the
    paper's 0.1), its label smoothing the paper's 0.1. Without label smoothing val BLEU is
    lower and val PPL too."""
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.seeds = [1, 2, 3, 4, 5]
    spec.budget = {**spec.budget, "model.dropout": 0.3}
    spec.variants = {
        "base": {},
        "heads_1": {"model.heads": 1},
        "heads_16": {"model.heads": 16},
        "dropout_0.0": {"model.dropout": 0.0},
        "label_smoothing_0.0": {"train.label_smoothing": 0.0},
    }
    spec.paper = {
        "heads_1": {"bleu": -0.6, "rows": "(A) h=1 vs h=4"},
        "heads_16": {"bleu": 0.3, "rows": "(A) h=16 vs h=4"},
        "dropout_0.0": {"bleu": -1.2, "rows": "(D) P_drop 0.0 vs 0.1"},
        "label_smoothing_0.0": {"bleu": -0.5, "ppl": -0.25, "rows": "(D) eps_ls 0.0 vs 0.1"},
    }
    refs = references
    study_dir = tmp_path / "results" / spec.study
    for variant, damage in COMPLETE.items():
        smoothing_off = variant == "label_smoothing_0.0"
        for seed, (every, offset) in enumerate(damage, start=1):
            val = 38.0 + seed / 10 - 2.0 * smoothing_off
            ppl = 6.0 + seed / 20 - 0.5 * smoothing_off
            write_trial(study_dir, variant, seed, damaged(refs, every, offset), refs,
                        val=val, ppl=ppl)  # fmt: skip
    return spec, study_dir, refs


@pytest.mark.slow  # the sentence bootstrap of four comparisons over five seeds of 1000 sentences
def test_a_complete_study_states_what_differs_against_the_papers_rows_and_a_write_up(
    complete_study,
):
    """Once every planned trial has finished: Welch over seeds, Holm over the spec's
    comparisons, 'cannot tell' with the difference detectable at its Holm step (computed here
    from scipy and the seeds' spread), and the findings in prose: what differs and in which
    direction against the paper's row, naming what is not the same change, and the label-
    smoothing write-up against our val BLEU, test2016 BLEU and val PPL."""
    spec, study_dir, refs = complete_study
    rows = {r.variant: r for r in report.variant_rows(spec, report.load_records(study_dir), refs)}
    base = rows["base"]
    names = [v for v in spec.variants if v != "base"]
    welch = {v: welch_p(rows[v].test_bleu, base.test_bleu) for v in names}
    order = sorted(names, key=welch.get)  # Holm's steps: alpha / 4, / 3, / 2, / 1
    assert {v: rows[v].verdict for v in names} == {
        "heads_1": "holds", "dropout_0.0": "holds", "label_smoothing_0.0": "holds",
        "heads_16": "cannot tell",
    }  # fmt: skip
    assert order[-1] == "heads_16"
    spread = ((statistics.variance(rows["heads_16"].test_bleu)
               + statistics.variance(base.test_bleu)) / 2) ** 0.5  # fmt: skip
    detectable = seed_stats.detectable_difference(spread, 5, alpha=0.05 / 1)
    assert rows["heads_16"].holm_alpha == pytest.approx(0.05)
    assert rows["heads_16"].detectable == pytest.approx(detectable)
    table = report.grid_table(list(rows.values()))
    assert f"| cannot tell (detects {detectable:.2f}) |" in table

    text = report.markdown(spec, study_dir, with_states=False)
    interval = {v: stats.ttest_ind(rows[v].test_bleu, base.test_bleu, equal_var=False)
                .confidence_interval() for v in names}  # fmt: skip

    def measured(v: str) -> str:
        low, high = interval[v]
        return f"{rows[v].delta:+.2f} [{low:+.2f}, {high:+.2f}]"

    paragraph = next(line for line in text.splitlines() if line.startswith("**What differs"))
    assert "Holm over the spec's 4 comparisons at α = 0.05" in paragraph
    assert (
        f"heads_1 lowers it, {measured('heads_1')} (the paper's row (A) h=1 vs h=4: -0.6, the "
        "same direction; not the same change: at d_model 64 a head is 64/1 = 64 wide, 8 times "
        "narrower than the paper's 512/1 = 512 at the same h)"
    ) in paragraph
    assert (
        f"dropout_0.0 lowers it, {measured('dropout_0.0')} (the paper's row (D) P_drop 0.0 vs "
        "0.1: -1.2, the same direction; not the same change: here model.dropout goes 0.3 → 0.0 "
        "from our base's 0.3; the paper's base has 0.1, and its row is (D) P_drop 0.0 vs 0.1)"
    ) in paragraph
    assert (
        f"label_smoothing_0.0 lowers it, {measured('label_smoothing_0.0')} (the paper's row "
        "(D) eps_ls 0.0 vs 0.1: -0.5, the same direction)"
    ) in paragraph
    assert f"Cannot tell for heads_16 ({rows['heads_16'].delta:+.2f}; detectable " in paragraph
    # the table's note says what the paper's column is, naming the rows that are another change
    assert "for heads_1, heads_16, dropout_0.0 it is not the same change" in text
    # and the one-sentence summary says which verdicts on the paper's rows are another change
    assert (
        f"holds: heads_1 ({rows['heads_1'].delta:+.2f}, not the paper's change), dropout_0.0 "
        f"({rows['dropout_0.0'].delta:+.2f}, not the paper's change), label_smoothing_0.0 "
        f"({rows['label_smoothing_0.0'].delta:+.2f}); cannot tell: heads_16 "
        f"({rows['heads_16'].delta:+.2f})."
    ) in text
    # README's line for a study whose page holds its tables carries that sentence once all ran
    in_short = next(line for line in text.splitlines() if line.startswith("**In short**"))
    assert report.progress_block(spec, study_dir) == f"25 of 25 trials finished.\n\n{in_short}\n"

    # The write-up: smoothing (the base, 0.1) against none, on each measure, with the interval
    # of the difference Welch's test inverts
    none = rows["label_smoothing_0.0"]

    def against_none(a: list[float], b: list[float]) -> tuple[float, float, float]:
        low, high = stats.ttest_ind(a, b, equal_var=False).confidence_interval()
        return statistics.fmean(a) - statistics.fmean(b), low, high

    val = against_none(base.val_bleu, none.val_bleu)
    test = against_none(base.test_bleu, none.test_bleu)
    ppl = against_none(base.val_ppl, none.val_ppl)
    write_up = next(line for line in text.splitlines() if line.startswith("**Beside another"))
    assert "+5.8 val and +4.8 test BLEU, with worse perplexity" in write_up
    assert "ted_hrlr_translate" in write_up
    assert (
        "Here train.label_smoothing 0.1 against 0.0 (base against label_smoothing_0.0) gives "
        f"val BLEU {val[0]:+.2f} [{val[1]:+.2f}, {val[2]:+.2f}], test2016 {test[0]:+.2f} "
        f"[{test[1]:+.2f}, {test[2]:+.2f}] and val PPL {ppl[0]:+.2f} [{ppl[1]:+.2f}, {ppl[2]:+.2f}]"
    ) in write_up
    assert val[2] < 5.8 and test[2] < 4.8  # both gains lie above our intervals
    assert "our runs do not show a gain of that size" in write_up
    assert ppl[1] > 0 and none.ppl_holm_p <= 0.05  # smoothing's val PPL is higher
    assert (
        f"val PPL is higher with train.label_smoothing 0.1 (Welch over seeds, Holm p = "
        f"{none.ppl_holm_p:.3f}): the write-up's worse perplexity"
    ) in write_up


@pytest.mark.slow  # the same bootstrap, the charts and a W&B run
def test_the_complete_report_is_logged_to_wandb_as_the_studys_run(complete_study, tmp_path):
    """write_report logs the study's report run (offline here): its summary says the verdicts
    are final and gives each, and report.md travels with the charts as a 'report' artifact."""
    from pipeline import tracking

    spec, study_dir, refs = complete_study
    report.write_report(spec, study_dir, log_to_wandb=True)
    (run_dir,) = tracking.offline_run_dirs(tmp_path / "wandb" / spec.study)
    logged = tracking.read_offline_run(run_dir)
    assert logged["complete"]
    assert logged["run"]["name"] == f"{spec.study}-report" and logged["run"]["group"] == spec.study
    summary = logged["summary"]
    assert (summary["final"], summary["trials_finished"], summary["trials_planned"]) == (
        True, 25, 25,
    )  # fmt: skip
    rows = report.variant_rows(spec, report.load_records(study_dir), refs)
    assert summary["verdicts"] == {r.variant: report.verdict_cell(r)
                                   for r in rows if r.delta is not None}  # fmt: skip
    (artifact,) = [a for a in logged["artifacts"] if a["type"] == "report"]
    made = [report.CHARTS[name] for name in ("bleu_per_variant", "ppl_vs_bleu", "learning_curves")]
    assert {"report.md", *made} <= set(artifact["files"])
    assert report.CHARTS["heads_width"] not in artifact["files"]  # no variant sets model.head_dim


def test_the_failed_attempts_sentence_says_what_became_of_each_point(study):
    """The trial states name each failed attempt's point and what the storage and records show
    of it since: finished (a record), running or queued again, or not run again; and how many
    the worker marked preempted. A trial that failed before it asked for its params is placed
    by the point it was queued with."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    spec, study_dir = study
    space = {"variant": CategoricalDistribution(["base", "heads_1", "heads_8", "heads_16"]),
             "seed": CategoricalDistribution([1, 2, 3, 4])}  # fmt: skip

    def trial(state, variant, seed, preempted=False, asked=True):
        point = {"variant": variant, "seed": seed}
        return create_trial(
            state=state,
            params=point if asked else None,
            distributions=space if asked else None,
            user_attrs={"preempted": True} if preempted else None,
            system_attrs={"fixed_params": point},
            value=1.0 if state == TrialState.COMPLETE else None,
        )

    trials = [
        trial(TrialState.FAIL, "heads_1", 1, preempted=True),
        trial(TrialState.FAIL, "heads_1", 1, asked=False),
        trial(TrialState.COMPLETE, "heads_1", 1),
        trial(TrialState.FAIL, "heads_16", 4, preempted=True),
        trial(TrialState.RUNNING, "heads_16", 4),
        trial(TrialState.FAIL, "heads_8", 2),
        trial(TrialState.WAITING, "heads_8", 2),
        trial(TrialState.FAIL, "heads_16", 3),
    ]
    records = report.load_records(study_dir)  # heads_1 seed 1 has its record
    assert report.failed_attempts(trials, records) == (
        "; its 5 failed attempts were at 4 points (2 marked preempted by their worker): "
        "heads_1 seed 1 (2 failed attempts) ran again and finished; heads_16 seed 4 is running "
        "again; heads_8 seed 2 is queued to run again; heads_16 seed 3 has not run again"
    )
    assert report.failed_attempts(trials[2:3], records) == ""
    # many points finished: counted, not named
    many = [trial(TrialState.FAIL, "base", 1), trial(TrialState.FAIL, "base", 2),
            trial(TrialState.FAIL, "heads_1", 1), trial(TrialState.FAIL, "heads_1", 2)]  # fmt: skip
    assert report.failed_attempts(many, records).endswith(": all 4 ran again and finished")
    # and in the report's first line, from the study's storage
    storage = optuna.create_study(study_name=spec.study,
                                  storage=f"sqlite:///{study_dir / 'study.db'}")  # fmt: skip
    storage.add_trial(trials[0])
    assert report.trial_states(spec, study_dir) == (
        "1 fail in study.db; its 1 failed attempt was at 1 point (1 marked preempted by their "
        "worker): heads_1 seed 1 ran again and finished"
    )


def test_the_hours_left_of_an_unmeasured_variant_scale_the_bases_by_the_specs_trial_hours():
    """A variant none of whose trials has finished counts at its `trial_hours` relative to the
    base's, times the base's measured hours (the spec's hours are relative costs measured on
    another machine); without `trial_hours`, at the median over the finished trials."""
    from pipeline.report.progress import hours_left

    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    spec.seeds = [1, 2, 3]
    done = [
        report.TrialRecord(folder=REPO_ROOT / f"base-seed{seed}", variant="base", seed=seed, train={},
                           eval={}, curve=[], run={"train_wall_time_s": spent * 3600,
                                                   "eval_wall_time_s": 0.0})
        for seed, spent in ((1, 0.5), (2, 0.7))
    ]  # fmt: skip
    # base seed 3 at the base's median 0.6 h; heads_1's three seeds at 3 x 0.6 h each
    spec.trial_hours = {"base": 1.0, "heads_1": 3.0}
    assert hours_left(spec, done) == pytest.approx(0.6 + 3 * 1.8)
    spec.trial_hours = {}
    assert hours_left(spec, done) == pytest.approx(4 * 0.6)
