"""Scoring against the independent reference: the sacrebleu command line on the same files."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from pipeline.errors import DataError
from pipeline.evaluation.scoring import (
    LITERATURE_METRIC,
    bleu_from_statistics,
    moses_tokenized,
    paired_bootstrap,
    paired_bootstraps,
    pooled_paired_bootstrap,
    score,
    sentence_bleu_statistics,
)

SACREBLEU_CLI = Path(sys.executable).parent / "sacrebleu"
WIDTH = 4  # decimals the CLI prints with `-w 4`


def perturb(sentence: str, rng: random.Random, vocabulary: list[str]) -> str:
    """A plausible system error: drop, swap, substitute or lowercase a word, or nothing."""
    words = sentence.split()
    action = rng.choice(["keep", "drop", "swap", "substitute", "lower", "truncate"])
    i = rng.randrange(len(words))
    if action == "drop" and len(words) > 1:
        del words[i]
    elif action == "swap" and len(words) > 1:
        j = min(i + 1, len(words) - 1) if i + 1 < len(words) else i - 1
        words[i], words[j] = words[j], words[i]
    elif action == "substitute":
        words[i] = rng.choice(vocabulary)
    elif action == "lower":
        words[i] = words[i].lower()
    elif action == "truncate":
        words = words[: max(1, len(words) // 2)]
    return " ".join(words)


@pytest.fixture(scope="module")
def references(multi30k_dir) -> list[str]:
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def make_system(references: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = sorted({w for line in references[:200] for w in line.split()})
    return [perturb(line, rng, vocabulary) for line in references]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def cli_json(ref: Path, hyp: Path, *extra: str) -> dict:
    """Score with the sacrebleu CLI; returns {metric name: {score, signature, ...}}."""
    out = subprocess.run(
        [str(SACREBLEU_CLI), str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "ter"]
        + ["-w", str(WIDTH), "-f", "json", *extra],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return {entry["name"]: entry for entry in json.loads(out)}


def test_score_equals_sacrebleu_cli(tmp_path, references):
    hypotheses = make_system(references, seed=1)
    assert hypotheses != references
    ref = write_lines(tmp_path / "ref.de", references)
    hyp = write_lines(tmp_path / "hyp.de", hypotheses)

    ours = score(hypotheses, references)
    cli = cli_json(ref, hyp)
    cli_lc = cli_json(ref, hyp, "-lc")

    assert round(ours["bleu"], WIDTH) == cli["BLEU"]["score"]
    assert round(ours["chrf"], WIDTH) == cli["chrF2"]["score"]
    assert round(ours["ter"], WIDTH) == cli["TER"]["score"]
    assert round(ours["bleu_lc"], WIDTH) == cli_lc["BLEU"]["score"]
    assert ours["signatures"]["bleu"] == cli["BLEU"]["signature"]
    assert ours["signatures"]["chrf"] == cli["chrF2"]["signature"]
    assert ours["signatures"]["ter"] == cli["TER"]["signature"]
    assert ours["signatures"]["bleu_lc"] == cli_lc["BLEU"]["signature"]
    assert "tok:13a" in ours["signatures"]["bleu"] and "case:mixed" in ours["signatures"]["bleu"]
    # Lowercasing forgives the "lower" perturbations, so it can only help.
    assert ours["bleu_lc"] > ours["bleu"]
    assert 0 < ours["bleu"] < 100 and 0 < ours["ter"] < 100


def test_bootstrap_half_width_equals_sacrebleu_cli_confidence(tmp_path, references):
    refs = references[:300]
    hypotheses = make_system(refs, seed=3)
    ref = write_lines(tmp_path / "ref.de", refs)
    hyp = write_lines(tmp_path / "hyp.de", hypotheses)
    n = 200
    env = {k: v for k, v in os.environ.items() if k != "SACREBLEU_SEED"}  # the CLI's default

    ours = score(hypotheses, refs, bootstrap_samples=n)
    out = subprocess.run(
        [str(SACREBLEU_CLI), str(ref), "-i", str(hyp), "-m", "bleu", "-lc", "--confidence"]
        + ["--confidence-n", str(n), "-w", str(WIDTH), "-f", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=300,
    ).stdout
    cli = json.loads(out)

    assert round(ours["bleu_lc_ci"], WIDTH) == cli["confidence_var"]
    assert ours["signatures"]["bleu_lc_ci"] == cli["signature"]
    assert f"bs:{n}" in cli["signature"] and "case:lc" in cli["signature"]
    assert 0 < ours["bleu_lc_ci"] < 10  # 300 sentences: a few BLEU either way
    # The point estimate is the plain score; without resamples there is no interval.
    assert round(ours["bleu_lc"], WIDTH) == cli["score"]
    assert "bleu_lc_ci" not in score(hypotheses, refs)


def test_score_is_cased_and_perfect_on_references(references):
    refs = references[:100]
    perfect = score(refs, refs)
    assert perfect["bleu"] == pytest.approx(100.0)
    assert perfect["chrf"] == pytest.approx(100.0)
    assert perfect["ter"] == pytest.approx(0.0)
    lowered = score([line.lower() for line in refs], refs)
    assert lowered["bleu"] < 90.0  # German nouns are capitalised: cased BLEU notices
    assert lowered["bleu_lc"] == pytest.approx(100.0)


def test_score_rejects_misaligned_inputs(references):
    with pytest.raises(DataError, match="99 hypotheses but 100 references"):
        score(references[:99], references[:100])
    with pytest.raises(DataError, match="nothing to score"):
        score([], [])


def parse_paired_cli_table(text: str) -> dict[str, tuple[float, float, float, float | None]]:
    """Rows of the CLI's text table -> {system: (score, mean, ci, p)} per metric column order."""
    rows = {}
    lines = text.splitlines()
    cell = re.compile(r"(-?[\d.]+) \((-?[\d.]+) ± ([\d.]+)\)")
    for k, line in enumerate(lines):
        cells = cell.findall(line)
        if not cells:
            continue
        name = line.split("│")[1].strip()
        p_values = re.findall(r"p = ([\d.]+)", lines[k + 1]) if k + 1 < len(lines) else []
        rows[name] = [
            (float(s), float(m), float(c), float(p_values[j]) if p_values else None)
            for j, (s, m, c) in enumerate(cells)
        ]
    return rows


def test_paired_bootstrap_equals_sacrebleu_cli(tmp_path, references):
    refs = references[:300]
    baseline = make_system(refs, seed=2)
    # The system: the baseline with a few sentences repaired -> a small, uncertain difference.
    system = [r if i % 25 == 0 else b for i, (b, r) in enumerate(zip(baseline, refs))]
    ref = write_lines(tmp_path / "ref.de", refs)
    base_file = write_lines(tmp_path / "baseline.de", baseline)
    sys_file = write_lines(tmp_path / "system.de", system)
    seed, n = 7, 200
    env_before = os.environ.get("SACREBLEU_SEED")

    ours = paired_bootstrap(baseline, system, refs, n_samples=n, seed=seed)
    text = subprocess.run(
        [str(SACREBLEU_CLI), str(ref), "-i", str(base_file), str(sys_file)]
        + [
            "-m",
            "bleu",
            "chrf",
            "ter",
            "--paired-bs",
            "--paired-bs-n",
            str(n),
            "-w",
            str(WIDTH),
            "-f",
            "text",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SACREBLEU_SEED": str(seed)},
        timeout=300,
    ).stdout
    table = parse_paired_cli_table(text)
    cli_base, cli_sys = table[f"Baseline: {base_file}"], table[str(sys_file)]
    for column, key in enumerate(["bleu", "chrf", "ter"]):
        result = ours[key]
        assert (round(result.baseline, WIDTH), round(result.baseline_mean, WIDTH)) == cli_base[
            column
        ][:2]
        assert round(result.baseline_ci, WIDTH) == cli_base[column][2]
        assert (
            round(result.system, WIDTH),
            round(result.system_mean, WIDTH),
            round(result.system_ci, WIDTH),
            round(result.p_value, WIDTH),
        ) == cli_sys[column]
        assert f"seed:{seed}" in result.signature and f"bs:{n}" in result.signature
    assert os.environ.get("SACREBLEU_SEED") == env_before  # restored after the test
    assert ours["bleu"].p_value > 1 / (n + 1)  # a non-trivial p-value was compared


def test_paired_bootstrap_separates_systems_and_is_seeded(references):
    refs = references[:300]
    baseline = make_system(refs, seed=3)
    much_better = [r if i % 2 == 0 else b for i, (b, r) in enumerate(zip(baseline, refs))]
    nearly_same = [r if i == 0 else b for i, (b, r) in enumerate(zip(baseline, refs))]

    strong = paired_bootstrap(baseline, much_better, refs, metrics=["bleu"], n_samples=200)
    weak = paired_bootstrap(baseline, nearly_same, refs, metrics=["bleu"], n_samples=200)
    assert strong["bleu"].system > strong["bleu"].baseline
    assert strong["bleu"].p_value < 0.05
    assert weak["bleu"].p_value > 0.05

    again = paired_bootstrap(baseline, much_better, refs, metrics=["bleu"], n_samples=200)
    other_seed = paired_bootstrap(
        baseline, much_better, refs, metrics=["bleu"], n_samples=200, seed=99
    )
    assert again == strong
    assert other_seed["bleu"].system_mean != strong["bleu"].system_mean
    with pytest.raises(ValueError, match="seed"):
        paired_bootstrap(baseline, much_better, refs, seed=0)
    with pytest.raises(DataError, match="the system"):
        paired_bootstrap(baseline, much_better[:-1], refs)


def test_several_systems_in_one_test_get_what_each_gets_alone(references):
    """One sacreBLEU test of several systems against a baseline (its statistics computed once)
    gives each system the result of its own test, as the CLI's --paired-bs of several."""
    refs = references[:300]
    baseline = make_system(refs, seed=3)
    systems = [make_system(refs, seed) for seed in (4, 5, 6)]
    together = paired_bootstraps(baseline, systems, refs, metrics=["bleu", "chrf"], n_samples=200)
    alone = [paired_bootstrap(baseline, system, refs, metrics=["bleu", "chrf"], n_samples=200)
             for system in systems]  # fmt: skip
    assert together == alone
    assert len({result["bleu"].p_value for result in alone}) > 1  # the systems do differ
    with pytest.raises(DataError, match="the system"):
        paired_bootstraps(baseline, [systems[0], systems[1][:-1]], refs)


def test_pooled_p_is_computed_once_per_content_and_anew_for_changed_text(references):
    """A report asks for each variant's pooled p once per block it writes: the same texts (in
    new lists) are answered from the first computation, a change to one sentence is not."""
    from pipeline.evaluation.scoring import _pooled_ps

    refs = references[:200]
    pairs = [(make_system(refs, seed), make_system(refs, seed + 10)) for seed in (1, 2)]
    first = pooled_paired_bootstrap(pairs, refs)
    computed = _pooled_ps.cache_info().misses
    copies = [([*base], [*system]) for base, system in pairs]
    assert pooled_paired_bootstrap(copies, [*refs]) == first
    assert _pooled_ps.cache_info().misses == computed

    copies[1][1][0] = refs[0]  # seed 2's system now gets its first sentence right
    changed = pooled_paired_bootstrap(copies, refs)
    assert _pooled_ps.cache_info().misses == computed + 1
    baseline = copies[0][0] + copies[1][0]
    system = copies[0][1] + copies[1][1]
    direct = paired_bootstrap(baseline, system, refs * 2, metrics=["bleu_lc"])["bleu_lc"]
    assert changed == direct.p_value


# ------------------------------------------------------------- the literature's tokenized BLEU


def test_moses_tokenized_text_is_multi30ks_lowercased_normalised_dehyphenated_tokens():
    text = ["Ein Mann im T-Shirt sagt: „Hallo“, und 3.5 km (rot)."]
    assert moses_tokenized(text, "de") == [
        'ein mann im t-shirt sagt : " hallo " , und 3.5 km ( rot ) .'
    ]


def test_tokenized_test2016_references_have_the_length_wu_et_al_scored_against(references):
    # Wu et al. (2021), Revisit-MMT README-baseline.md: "BLEU4 = 41.02 ... reflen=12103".
    assert sum(len(line.split()) for line in moses_tokenized(references, "de")) == 12103


def test_literature_bleu_is_plain_bleu_on_the_tokenized_text(references):
    system = make_system(references[:300], seed=7)
    scores = score(system, references[:300], lang="de")
    expected = BLEU(tokenize="none").corpus_score(
        moses_tokenized(system, "de"), [moses_tokenized(references[:300], "de")]
    )
    # Both are sacrebleu's float64 arithmetic on the same text: no CPU-dependent rounding.
    assert scores[LITERATURE_METRIC] == pytest.approx(expected.score, abs=1e-9)
    assert "tok:none" in scores["signatures"][LITERATURE_METRIC]
    assert "moses" in scores["signatures"][LITERATURE_METRIC]
    # It differs from 13a BLEU on the same text (other tokens), and from nothing without lang.
    assert scores[LITERATURE_METRIC] != pytest.approx(scores["bleu_lc"], abs=1e-6)
    assert LITERATURE_METRIC not in score(system, references[:300])


def test_systems_that_score_zero_on_every_resample_differ_by_nothing(references):
    """Two systems with 0.00 BLEU on every resample: sacreBLEU alone answers its smallest p,
    1/(n+1), which a report reads as a significant difference; there is none to see."""
    refs = references[:50]
    silent, babbling = ["."] * len(refs), ["xyzzy plugh"] * len(refs)
    result = paired_bootstrap(silent, babbling, refs, metrics=["bleu"], n_samples=200)["bleu"]
    assert result.baseline == result.system == 0.0
    assert result.p_value == 1.0


@pytest.mark.parametrize("lowercase", [False, True])
def test_summed_sentence_statistics_give_sacrebleus_corpus_bleu(lowercase):
    """The private statistics API of the installed sacreBLEU, summed over sentences (as the
    validation BLEU sums them over batches and processes), scores what its public
    `corpus_score` does: a sacreBLEU release that changes them fails here."""
    hypotheses = ["A man is riding a red bike .", "Two dogs play in the snow", "a woman",
                  "Ein Mann fährt Fahrrad .", "x y z"]  # fmt: skip
    references = ["A man rides a red bicycle .", "Two dogs are playing in the snow .",
                  "A woman sings on a stage .", "ein Mann fährt ein Fahrrad .", "a b c"]  # fmt: skip
    bleu = BLEU(lowercase=lowercase)
    per_sentence = sentence_bleu_statistics(bleu, hypotheses, references)
    assert len(per_sentence) == len(hypotheses)
    summed = [sum(column) for column in zip(*per_sentence)]
    expected = BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score
    assert expected > 0
    assert bleu_from_statistics(bleu, summed) == pytest.approx(expected, abs=1e-12)
    # sentence by sentence too: one pair's statistics are that pair's corpus BLEU
    for hypothesis, reference, statistics in zip(hypotheses, references, per_sentence):
        alone = BLEU(lowercase=lowercase).corpus_score([hypothesis], [[reference]]).score
        assert bleu_from_statistics(bleu, statistics) == pytest.approx(alone, abs=1e-12)
