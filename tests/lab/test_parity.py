"""README's "Parity with fairseq" table comes from committed runs of both systems, and its
comparisons are sacreBLEU's paired bootstrap of those runs' own translations."""

from __future__ import annotations

import functools
import json
import math
import re
import statistics

import pytest
import sacrebleu
import yaml
from scipy import stats

from benchmarks.fairseq import parity, train_peer
from pipeline import config, docs_blocks, results
from pipeline.errors import DataError
from pipeline.evaluation import scoring, seed_stats
from tests.conftest import NUMBER_WORDS, REPO_ROOT, gzip_head

SPLITS = ("val", "test_2016_flickr")


SHORT_SPLIT = 200  # sentences of each split the made-up runs translate (scoring them is most
# of these tests' time; a bootstrap still tells a degraded system apart on this many)


@pytest.fixture
def references(multi30k_dir, monkeypatch) -> dict[str, list[str]]:
    """The real references of each split, which the committed runs translated."""
    return references_in(multi30k_dir, monkeypatch)


@pytest.fixture
def short_references(multi30k_dir, tmp_path, monkeypatch) -> dict[str, list[str]]:
    """The first SHORT_SPLIT references of each split, read from a copy of the corpus cut to
    them: what the made-up runs below translate."""
    corpus = tmp_path / "short-corpus"
    corpus.mkdir()
    for name in (f"{split}.{lang}.gz" for split in SPLITS for lang in ("en", "de")):
        gzip_head(multi30k_dir / name, corpus / name, SHORT_SPLIT)
    return references_in(corpus, monkeypatch)


def references_in(corpus, monkeypatch) -> dict[str, list[str]]:
    """Each split's scoring references, with `corpus` the one parity reads."""
    monkeypatch.setenv(train_peer.CORPUS_ENV, str(corpus))
    return {split: parity.scoring_references(split) for split in SPLITS}


@pytest.fixture
def committed(tmp_path, short_references):
    """Empty results folders, and writers of committed runs of each system scored against the
    real references of `short_references`."""
    references = short_references
    root = tmp_path / "results"
    wu_preset = config.to_dict(config.compose([f"experiment={parity.WU_RECIPE}"]))
    wu_decoding = wu_preset["eval"]
    wu_batching = {key: wu_preset["train"][key] for key in parity.RECIPE_KEYS["train"]}
    wu_subwords = wu_preset["data"]["tokenizer"]["model_type"]
    wu_model = {"init": wu_preset["model"]["init"]}

    def fairseq_result(name, translations, seed=1, max_update=3000, smoke=False):
        out = root / "parity" / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        scores = {}
        for split, lines in translations.items():
            scores[split] = scoring.score(lines, references[split], lang="de")
            train_peer.hypotheses_path(out, split).write_text("\n".join(lines) + "\n")
        payload = {
            "benchmark": "fairseq_peer", "smoke": smoke,
            "recipe": {"seed": seed, "max_update": max_update},
            "venv": {"versions": {"fairseq": "0.12.3.1"}}, "updates": max_update,
            "target_tokens": 6900 * max_update, "wall_s": {"train": 5400.0},
            "tokens_per_s": 3800.0, "scores": scores, "hardware": "a CPU", "threads": 1,
            "command": f"/venv/python -m benchmarks.fairseq.train_peer --out {out} --seed {seed}",
        }  # fmt: skip
        out.write_text(json.dumps(payload))

    def our_row(name, translations, seed=1234, max_steps=3000, recipe=parity.WU_RECIPE,
                decoding=wu_decoding, batching=wu_batching, model=None,
                subwords=wu_subwords):  # fmt: skip
        run = tmp_path / name
        metrics, hypotheses = run / "metrics", run / "eval"
        metrics.mkdir(parents=True)
        hypotheses.mkdir()
        evaluation = {}
        for split, lines in translations.items():
            evaluation[split] = scoring.score(lines, references[split], lang="de")
            (hypotheses / f"{split}.hyp").write_text("\n".join(lines) + "\n")
        train = {"steps": max_steps, "wall_time_s": 3600.0, "train/tokens_per_sec": 5000.0,
                 "precision": "bf16-mixed", "train/target_tokens": 6800 * max_steps}  # fmt: skip
        files = {"prepare.json": {}, "tokenize.json": {}, "train.json": train,
                 "eval.json": evaluation}  # fmt: skip
        for file, content in files.items():
            (metrics / file).write_text(json.dumps(content))
        params = {"experiment_name": recipe, "seed": seed,
                  "train": {"max_steps": max_steps, **batching},
                  "data": {"src_lang": "en", "tgt_lang": "de",
                           "tokenizer": {"model_type": subwords}}, "eval": decoding,
                  "model": model or wu_model}  # fmt: skip
        (run / "params.yaml").write_text(yaml.safe_dump(params))
        command = f"dvc exp run -S experiment={recipe} -S seed={seed}"
        results.record(name, command, metrics, run / "params.yaml", root, hypotheses)

    exact = {split: references[split] for split in SPLITS}
    worse = {split: _degraded(references[split]) for split in SPLITS}
    return root, fairseq_result, our_row, exact, worse


def _degraded(lines: list[str]) -> list[str]:
    """Each reference without its last two words: a clearly worse system."""
    return [" ".join(line.split()[:-2]) for line in lines]


def test_each_shared_budget_is_compared_with_a_paired_bootstrap(committed, tmp_path):
    root, fairseq_result, our_row, exact, worse = committed
    parity_dir = root / "parity"
    fairseq_result("fairseq_3000_seed1", worse, max_update=3000)
    our_row("wu_3000.en-de", exact, max_steps=3000)
    fairseq_result("fairseq_8000_seed1", exact, max_update=8000)
    our_row("wu_8000.en-de", worse, max_steps=8000)

    block = parity.markdown(root, parity_dir)
    worse_bleu = {
        split: json.loads((root / "wu_8000.en-de" / "eval.json").read_text())[split]["bleu_lc"]
        for split in SPLITS
    }
    comparisons = [line for line in block.splitlines() if line.startswith("- ")]
    # 1 resample in 1001 at most: the degraded system is worse in every resample
    assert comparisons == [
        "- 3000 updates, 1 seed pair(s): ours - fairseq, lowercased BLEU: "
        f"val {100 - worse_bleu['val']:+.2f} (p = 0.001); "
        f"test_2016_flickr {100 - worse_bleu['test_2016_flickr']:+.2f} (p = 0.001)",
        "- 8000 updates, 1 seed pair(s): ours - fairseq, lowercased BLEU: "
        f"val {worse_bleu['val'] - 100:+.2f} (p = 0.001); "
        f"test_2016_flickr {worse_bleu['test_2016_flickr'] - 100:+.2f} (p = 0.001)",
    ]
    assert 0 < worse_bleu["test_2016_flickr"] < 90
    # sacreBLEU's own lengths of the degraded system: its brevity penalty is what it loses
    shorter = {split: sacrebleu.corpus_bleu(worse[split], [exact[split]], lowercase=True)
               for split in SPLITS}  # fmt: skip
    ratio = {split: shorter[split].sys_len / shorter[split].ref_len for split in SPLITS}
    assert all(r < 0.9 for r in ratio.values())
    lengths = [line for line in block.splitlines() if line.startswith("  - output length")]
    assert [line.split("ours / fairseq: ")[1] for line in lengths] == [
        f"val 1.000 / {ratio['val']:.3f}; test_2016_flickr 1.000 / {ratio['test_2016_flickr']:.3f}",
        f"val {ratio['val']:.3f} / 1.000; test_2016_flickr {ratio['test_2016_flickr']:.3f} / 1.000",
    ]
    rows = [line for line in block.splitlines() if line.startswith(("| ours", "| fairseq"))]
    assert len(rows) == 4
    assert (
        "| fairseq 0.12.3.1 | Wu et al. 2021 (fairseq) | 1 | 3000 | 3000 | 20.7 M | 6,900 |"
        in block
    )


def test_seeds_are_paired_and_only_shared_budgets_of_wu_s_recipe_compared(committed, tmp_path):
    """Rows recorded under an earlier setting of the recipe are named with it and compared
    apart, after the recipe as it is."""
    root, fairseq_result, our_row, exact, worse = committed
    parity_dir = root / "parity"
    for seed in (1, 2):
        fairseq_result(f"fairseq_seed{seed}", worse, seed=seed)
        our_row(f"wu_s{seed}.en-de", exact, seed=seed)
    our_row("wu_1000.en-de", exact, max_steps=1000)  # fairseq never ran 1000
    our_row("other.en-de", worse, recipe="multi30k_base")  # neither recipe
    # decoded before the preset's length normalization changed (no key then: the default)
    preset = config.to_dict(config.compose([f"experiment={parity.WU_RECIPE}"]))["eval"]
    earlier = {key: value for key, value in preset.items() if key != "length_normalization"}
    our_row("wu_gnmt.en-de", worse, seed=0, decoding=earlier)
    # batched under our own budget before the preset took fairseq's (no key then: the default)
    our_row(
        "wu_sum_s2.en-de",
        worse,
        seed=2,
        batching={"max_tokens": 8192, "accumulate_grad_batches": 2},
    )
    our_row(
        "wu_sum_s3.en-de",
        worse,
        seed=3,
        batching={"max_tokens": 8192, "accumulate_grad_batches": 2},
    )

    our_row("wu_init.en-de", exact, seed=4, max_steps=2000, model={"init": "xavier"})
    # segmented by sentencepiece before the preset took subword-nmt's BPE
    our_row("wu_spm.en-de", worse, seed=5, max_steps=2000, subwords="bpe")

    block = parity.markdown(root, parity_dir)
    comparisons = [line for line in block.splitlines() if line.startswith("- ")]
    assert "| ours | multi30k_wu2021, model.init xavier | 4 | 2000 |" in block
    assert "| ours | multi30k_wu2021, data.tokenizer.model_type bpe | 5 | 2000 |" in block
    summed = (
        "multi30k_wu2021, train.max_tokens 8192, train.batch_budget sum, "
        "train.loss_normalization batch"
    )
    assert [line.split(": ours - fairseq")[0] for line in comparisons] == [
        "- 3000 updates, 2 seed pair(s)",
        "- 3000 updates (ours: multi30k_wu2021, eval.length_normalization gnmt), 1 seed pair(s)",
        f"- 3000 updates (ours: {summed}), 2 seed pair(s)",
    ]
    assert "multi30k_base" not in block and "| 1000 | 1000 |" in block
    assert "| ours | multi30k_wu2021, eval.length_normalization gnmt | 0 | 3000 |" in block
    assert f"| ours | {summed} | 2 | 3000 |" in block
    # the exact rows against the worse fairseq, the degraded ones about level with it
    assert float(comparisons[0].split("val ")[1].split(" ")[0]) > 5
    assert abs(float(comparisons[2].split("val ")[1].split(" ")[0])) < 0.01


def test_no_shared_budget_says_so_and_smoke_runs_are_refused(committed, tmp_path):
    root, fairseq_result, our_row, exact, _ = committed
    parity_dir = root / "parity"
    our_row("wu.en-de", exact)
    assert parity.markdown(root, parity_dir).endswith("- no budget run by both systems yet\n")
    fairseq_result("smoke", exact, smoke=True)
    with pytest.raises(DataError, match="smoke.json: a smoke run"):
        parity.markdown(root, parity_dir)


WU_BUDGET = 8000  # Wu et al.'s budget (updates allowed; early stopping ends sooner)


def test_the_parity_pages_lead_bounds_the_point_estimates_at_both_budgets():
    """The page's first finding: the largest |ours - fairseq| over both splits, rounded up to a
    tenth, at each budget with its number of seed pairs, as the records give them."""
    bounds = []
    for budget in (PARITY_BUDGET, WU_BUDGET):
        mine, other = _equal_budget_groups(budget)[parity.WU_RECIPE]
        largest = max(abs(d) for d in _ours_minus_fairseq(mine, other).values())
        bounds.append((math.ceil(largest * 10) / 10, NUMBER_WORDS[len(mine)]))
    (at_parity, pairs), (at_wu, wu_pairs) = bounds
    assert (
        f"point estimates lie within {at_parity:.1f} BLEU at {PARITY_BUDGET} updates over "
        f"{pairs} seed pairs, and within {at_wu:.1f} at Wu et al.'s budget over {wu_pairs}; "
        "neither can show them equal"
    ) in _parity_pages()


def test_the_parity_pages_block_is_the_commands_output(references):
    """docs/parity.md's table and docs/parity-comparisons.md's comparisons are exactly
    `python -m benchmarks.fairseq.parity --update-docs`."""
    expected = parity.blocks(REPO_ROOT / "results", REPO_ROOT / parity.PARITY_DIR)
    assert [page.name for page, _ in expected] == ["parity.md", "parity-comparisons.md"]
    for (page, name), block in expected.items():
        assert docs_blocks.read(REPO_ROOT / page, name) == block, page


def write_decoding(parity_dir, name, by_search, references, seed=1, splits=SPLITS,
                   subwords="subword-nmt (Wu et al.)"):  # fmt: skip
    """A benchmarks.fairseq.decode_checkpoint result: one model's translations by each search."""

    out = parity_dir / parity.DECODING_DIR / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    entries = {}
    for split in splits:
        scores = {}
        for search, translations in by_search.items():
            scores[search] = scoring.score(translations[split], references[split], lang="de")
            train_peer.hypotheses_path(out, split, search).write_text(
                "\n".join(translations[split]) + "\n"
            )
        entries[split] = {
            "sentences": len(references[split]), "scores": scores,
            "paired_bootstrap_bleu_lc": {"ours_minus_fairseq": 1.25, "p_value": 0.01},
            "identical_hypotheses": 7,
            "model_score": {"ours_higher": 3, "fairseq_higher": 2},
        }  # fmt: skip
    payload = {
        "benchmark": "fairseq_decode",
        "run": {"experiment": parity.WU_RECIPE, "seed": seed, "max_steps": 3000,
                "init": "fairseq", "subwords": subwords},
        "training": {"steps": 3000, "wall_time_s": 2400.0, "train/tokens_per_sec": 9000.0,
                     "train/target_tokens": 20_000_000, "precision": "bf16-mixed"},
        "splits": entries, "provenance": {"hardware": "a CPU"},
        "train_command": "dvc exp run -S seed=1", "command": "python -m benchmarks.fairseq.decode_checkpoint",
    }  # fmt: skip
    out.write_text(json.dumps(payload))
    return out


def test_one_model_decoded_by_both_searches_is_two_rows_and_a_line(committed, short_references):
    """A decode_checkpoint result gives a row per search (the model trained by ours), each
    compared with fairseq's runs of its budget, and one line of the two searches side by side."""
    references = short_references
    root, fairseq_result, _, exact, worse = committed
    parity_dir = root / "parity"
    fairseq_result("fairseq_seed1", worse, seed=1)
    write_decoding(parity_dir, "snmt_seed1", {"ours": exact, "fairseq": worse}, references)

    block = parity.markdown(root, parity_dir)
    named = "multi30k_wu2021, subword-nmt (Wu et al.) subwords"  # init fairseq: the preset's
    assert f"| ours | {named} | 1 | 3000 | 3000 | 20.0 M | 6,667 | 40 min | 9,000 |" in block
    assert f"| ours | {named}, fairseq 0.12's beam search | 1 | 3000 |" in block
    assert "| a CPU, bf16-mixed | `dvc exp run -S seed=1; python -m benchmarks" in block
    comparisons = [line for line in block.splitlines() if line.startswith("- ")]
    assert [line.split(": ours - fairseq")[0] for line in comparisons[:2]] == [
        f"- 3000 updates (ours: {named}), 1 seed pair(s)",
        f"- 3000 updates (ours: {named}, fairseq 0.12's beam search), 1 seed pair(s)",
    ]
    assert float(comparisons[0].split("val ")[1].split(" ")[0]) > 5  # exact against worse
    assert abs(float(comparisons[1].split("val ")[1].split(" ")[0])) < 0.01  # the same text
    assert comparisons[2].startswith("- one model (`") and "snmt_seed1.json" in comparisons[2]
    assert comparisons[2].endswith(
        f"test_2016_flickr +1.25 (p = 0.010), 7 of {len(references['test_2016_flickr'])} the "
        "same, the model ranks ours higher 3 times, fairseq's 2"
    )

    write_decoding(parity_dir, "val_only", {"ours": exact, "fairseq": worse}, references,
                   splits=("val",))  # fmt: skip
    with pytest.raises(DataError, match="val_only.json: a row needs both"):
        parity.markdown(root, parity_dir)


def test_a_decoded_run_is_named_by_its_segmentation_against_the_preset(committed, short_references):
    """A model of the preset as it is (its own tokenizer) is named by the recipe alone; one
    segmented by another tokenizer is named with it."""
    references = short_references
    root, fairseq_result, _, exact, worse = committed
    parity_dir = root / "parity"
    fairseq_result("fairseq_seed1", worse, seed=1)
    preset = config.to_dict(config.compose([f"experiment={parity.WU_RECIPE}"]))
    write_decoding(parity_dir, "preset", {"ours": exact, "fairseq": exact}, references,
                   subwords=preset["data"]["tokenizer"]["model_type"])  # fmt: skip
    write_decoding(parity_dir, "spm", {"ours": worse, "fairseq": worse}, references, seed=2,
                   subwords="bpe")  # fmt: skip
    block = parity.markdown(root, parity_dir)
    assert "| ours | multi30k_wu2021 | 1 | 3000 |" in block
    assert "| ours | multi30k_wu2021, fairseq 0.12's beam search | 1 | 3000 |" in block
    assert "| ours | multi30k_wu2021, data.tokenizer.model_type bpe | 2 | 3000 |" in block


def test_the_figure_shows_fairseq_and_the_preset_as_it_is(committed, tmp_path):
    root, fairseq_result, our_row, exact, worse = committed
    parity_dir = root / "parity"
    for seed in (1, 2):
        fairseq_result(f"fairseq_seed{seed}", worse, seed=seed)
        our_row(f"wu_s{seed}.en-de", exact, seed=seed)
    our_row("wu_spm.en-de", worse, seed=5, subwords="bpe")  # an earlier setting: not drawn
    runs = parity.all_runs(root, parity_dir)
    drawn = parity.figure(runs, tmp_path / "parity.png")
    assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {(r.system, r.seed) for r in parity.drawn_runs(runs)} == {
        ("fairseq 0.12.3.1", 1), ("fairseq 0.12.3.1", 2), ("ours", 1), ("ours", 2)
    }  # fmt: skip


def _scored_run(system: str, seed: int, val: float, test: float) -> parity.Run:
    return parity.Run(
        system=system, experiment=parity.WU_RECIPE, recipe=parity.WU_RECIPE, seed=seed,
        updates=3000, max_updates=3000, target_tokens=None, train_wall_s=None,
        tokens_per_s=None, scores={"val": {"bleu_lc": val}, "test_2016_flickr": {"bleu_lc": test}},
        hardware="a CPU", command="c", hypotheses={},
    )  # fmt: skip


def test_the_seed_level_line_gives_welchs_interval_and_whether_it_lies_within_the_margin():
    """Two seeds a side: the interval is scipy's Welch interval at 90%; a tight pair of groups
    lies within +-0.3 on val, a spread pair does not on test2016. One seed a side: none."""
    ours = [_scored_run("ours", 1, 41.00, 40.0), _scored_run("ours", 2, 41.02, 42.0)]
    theirs = [_scored_run("fairseq", 1, 40.98, 40.5), _scored_run("fairseq", 2, 41.01, 41.5)]
    line = parity.seed_level_line(ours, theirs)
    for split, (a, b) in {"val": ([41.00, 41.02], [40.98, 41.01]),
                          "test_2016_flickr": ([40.0, 42.0], [40.5, 41.5])}.items():  # fmt: skip
        interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
        assert f"{split} [{interval.low:.2f}, {interval.high:.2f}]" in line
    assert line.endswith(
        "within +-0.3 BLEU (equivalence at the margin): val yes; test_2016_flickr no"
    )
    single = parity.seed_level_line(ours[:1], theirs[:1])
    assert single.endswith(f"none ({seed_stats.SINGLE_RUN})")


def _flat(path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def _parity_pages() -> str:
    """docs/parity.md (the table) and docs/parity-comparisons.md (what it shows), as one text."""
    return " ".join(_flat(REPO_ROOT / page) for page in (parity.PAGE, parity.COMPARISONS_PAGE))


PARITY_BUDGET = 3000  # the budget at which both systems ran two seeds (the page's first line)


@functools.cache
def _equal_budget_groups(budget: int = PARITY_BUDGET) -> dict[str, tuple[list, list]]:
    """Per recipe, ours (by seed) and fairseq's runs paired with them at `budget` updates."""
    groups = [(recipe, sorted(m, key=lambda r: r.seed), o)
              for recipe, at, m, o in parity.paired_groups(_committed_runs())
              if at == budget]  # fmt: skip
    assert len({recipe for recipe, _, _ in groups}) == len(groups)  # one group per recipe
    return {recipe: (mine, other) for recipe, mine, other in groups}


def _ours_minus_fairseq(mine: list, other: list) -> dict[str, float]:
    """The difference of the seed means, ours - fairseq, per split."""
    return {split: statistics.fmean(r.scores[split]["bleu_lc"] for r in mine)
            - statistics.fmean(r.scores[split]["bleu_lc"] for r in other) for split in SPLITS}  # fmt: skip


def test_the_parity_prose_states_the_seed_level_intervals_and_each_sides_machine():
    """README and the parity pages of docs/ give ours - fairseq at the equal budget with its seed-level 90%
    intervals as the records make them, say whether those lie within the margin, and name the
    machine and precision of each side from its records."""
    mine, other = _equal_budget_groups()[parity.WU_RECIPE]
    intervals = parity.seed_intervals(mine, other)
    delta = _ours_minus_fairseq(mine, other)
    (val_low, val_high), (test_low, test_high) = intervals["val"], intervals["test_2016_flickr"]
    margin = parity.EQUIVALENCE_MARGIN
    within = [-margin < low and high < margin for low, high in intervals.values()]
    assert not any(within), "the intervals now lie within the margin: say so in the prose"
    ((ours_where, ours_precision),) = {_machine(r) for r in mine}
    ours = f"ours on {ours_where} in {ours_precision}"
    ((fairseq_where, fairseq_precision),) = {_machine(r) for r in other}
    assert all(", fp32," in r.hardware for r in other)
    fairseq = f"fairseq on {fairseq_where} in {fairseq_precision}"

    readme = _flat(REPO_ROOT / "README.md")
    assert f"({PARITY_BUDGET} updates; {ours}, {fairseq})" in readme
    assert (
        f"is {delta['val']:+.2f} val and {delta['test_2016_flickr']:+.2f} test2016 BLEU" in readme
    )
    assert (
        f"intervals, [{val_low:.2f}, {val_high:.2f}] and [{test_low:.2f}, {test_high:.2f}], "
        f"are wider than ±{margin}"
    ) in readme
    page = _parity_pages()
    assert f"at {PARITY_BUDGET} updates {ours} and {fairseq}" in page
    assert f"seeds 1 and 2 ({ours}, {fairseq})" in page
    assert (
        f"ours - fairseq {delta['val']:+.2f} on val (p = " in page
        and f"and {delta['test_2016_flickr']:+.2f} on test2016 (p = " in page
    )
    assert (
        f"[{val_low:.2f}, {val_high:.2f}] on val and [{test_low:.2f}, {test_high:.2f}] on "
        f"test2016, do not lie within ±{margin}: they allow ours to be up to "
        f"{-val_low:.2f} (val) or {-test_low:.2f} (test2016) BLEU below fairseq"
    ) in page
    assert "are level" not in page + readme and "is met on both splits" not in page


def test_the_parity_page_quotes_the_subword_counts_of_the_tokenize_records():
    """Target subwords per training sentence of each segmentation of Wu et al.'s recipe, as
    the tokenize stage counted them in every recorded row of it."""
    per_sentence: dict[str, set[float]] = {}
    for row in results.load_rows(REPO_ROOT / "results"):
        if row["params"]["experiment_name"] != parity.WU_RECIPE:
            continue
        tokenize = row["tokenize.json"]
        train = tokenize["splits"]["train"]
        per_sentence.setdefault(tokenize["model_type"], set()).add(
            round(train["tgt_tokens"] / train["sentences"], 2)
        )
    (sentencepiece,), (subword_nmt,) = per_sentence["bpe"], per_sentence["subword_nmt"]
    assert (
        f"On the training split (the tokenize stage's counts) sentencepiece cut the target side "
        f"into {sentencepiece:.2f} subwords per sentence against subword-nmt's {subword_nmt:.2f}"
    ) in _parity_pages()


def _seed_welch_p(a: list, b: list, split: str) -> float:
    scores = [[r.scores[split]["bleu_lc"] for r in runs] for runs in (a, b)]
    return float(stats.ttest_ind(*scores, equal_var=False).pvalue)


def test_the_presets_settings_table_states_measurements_with_their_seed_level_tests():
    """The parity page's table of what the preset took from fairseq gives each setting's runs
    as measured, with Welch's test over ours' seeds between the two settings: two seeds a
    side test no difference there, so none is credited to the setting."""
    bpe, xavier_init = (f"{parity.WU_RECIPE}, {change}"
                        for change in ("data.tokenizer.model_type bpe", "model.init xavier"))  # fmt: skip
    groups = _equal_budget_groups()
    (preset, fairseq), (sentencepiece, fairseq_bpe), (xavier, _) = (
        groups[recipe] for recipe in (parity.WU_RECIPE, bpe, xavier_init)
    )
    assert [r.seed for r in preset] == [r.seed for r in xavier] == [1, 2]
    page = _parity_pages()
    segmentation_p = [_seed_welch_p(sentencepiece, preset, split) for split in SPLITS]
    init_p = _seed_welch_p(xavier, preset, "val")
    assert all(p > seed_stats.ALPHA for p in [*segmentation_p, init_p]), "a tested difference"
    spm, own = _ours_minus_fairseq(sentencepiece, fairseq_bpe), _ours_minus_fairseq(preset, fairseq)
    assert (
        f"with sentencepiece BPE on the same text {spm['val']:+.2f} (val) and "
        f"{spm['test_2016_flickr']:+.2f} (test2016), one of its seeds on two CPU cores in fp32; "
        f"with subword-nmt's subwords as the preset runs them {own['val']:+.2f} and "
        f"{own['test_2016_flickr']:+.2f};"
    ) in page
    assert [r.hardware.split(", ")[-1] for r in sentencepiece].count("32-true") == 1
    assert (
        "two seeds a side cannot tell ours' two segmentations apart (Welch p = "
        f"{segmentation_p[0]:.2f} on val, {segmentation_p[1]:.2f} on test2016), in a comparison "
        "whose runs did not all share a machine and precision"
    ) in page
    lower = [
        p.scores["val"]["bleu_lc"] - x.scores["val"]["bleu_lc"] for p, x in zip(preset, xavier)
    ]
    vals = " and ".join(f"{x.scores['val']['bleu_lc']:.1f}" for x in xavier)
    assert (
        f"with Xavier the same two seeds gave val {vals}, {lower[0]:.2f} and {lower[1]:.2f} "
        f"lower, a difference two seeds a side do not test (Welch p = {init_p:.2f})"
    ) in page
    assert "on subword-nmt's subwords +0.31 and -0.15" not in page


@functools.cache
def _committed_runs() -> list[parity.Run]:
    """Every run the block's table lists, from the committed records, loaded once."""
    return parity.all_runs(REPO_ROOT / "results", REPO_ROOT / parity.PARITY_DIR)


def _preset_runs(budget: int) -> tuple[list, list]:
    """Every run of ours (the preset as it is) and of fairseq at `budget`, each in seed order:
    all of them, where `_equal_budget_groups` keeps only as many as there are seed pairs."""
    at_budget = [r for r in _committed_runs() if r.max_updates == budget]
    ours = [r for r in at_budget if r.system == "ours" and r.recipe == parity.WU_RECIPE]
    fairseq = [r for r in at_budget if r.system.startswith("fairseq")]
    return sorted(ours, key=lambda r: r.seed), sorted(fairseq, key=lambda r: r.seed)


@functools.cache
def _wu_rows() -> list[tuple[tuple[str, ...], dict]]:
    """Each recorded row of Wu et al.'s recipe, with the settings it changed from the preset."""
    preset = parity.wu_preset()
    return [(tuple(parity.recipe_changes(row["params"], preset)), row)
            for row in results.load_rows(REPO_ROOT / "results")
            if row["params"]["experiment_name"] == parity.WU_RECIPE]  # fmt: skip


@functools.cache
def _fairseq_records() -> list[dict]:
    """Every committed `benchmarks.fairseq.train_peer` result, as written."""
    paths = sorted((REPO_ROOT / parity.PARITY_DIR).glob("*.json"))
    payloads = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    return [payload for payload in payloads if payload.get("benchmark") == "fairseq_peer"]


def _seed_scores(runs: list, split: str) -> str:
    """Each run's lowercased BLEU as the prose lists seeds: `40.7 and 41.1`."""
    return " and ".join(f"{r.scores[split]['bleu_lc']:.1f}" for r in runs)


def _bootstrap_p(mine: list, other: list, references: dict, split: str) -> float:
    """The block's paired bootstrap of ours against fairseq, seeds paired in order and pooled."""
    pairs = list(zip((r.translations(split) for r in other), (r.translations(split) for r in mine)))
    return scoring.pooled_paired_bootstrap(pairs, references[split], parity.P_METRIC)


def _difference_with_p(mine: list, other: list, references: dict) -> str:
    """`-0.02 on val (p = 0.415) and +0.09 on test2016 (p = 0.284)`, from the records."""
    delta = _ours_minus_fairseq(mine, other)
    p = {split: _bootstrap_p(mine, other, references, split) for split in SPLITS}
    return " and ".join(f"{delta[split]:+.2f} on {name} (p = {p[split]:.3f})"
                        for split, name in zip(SPLITS, ("val", "test2016")))  # fmt: skip


def _machine(run) -> tuple[str, str]:
    """Where a run trained, as the prose names it (`one NVIDIA H200`, `two CPU cores`), and its
    precision, from its hardware cell."""
    cells = run.hardware.split(", ")
    if cells[-1].endswith(" thread(s)"):  # fairseq's cell ends with its threads
        cells = cells[:-1]
    if device := re.fullmatch(r"(.+) x (\d+)", cells[0]):
        return f"{NUMBER_WORDS[int(device[2])]} {device[1]}", cells[-1]
    (cores,) = [int(cell.split()[0]) for cell in cells if cell.endswith(" cores")]
    return f"{NUMBER_WORDS[cores]} CPU cores", cells[-1]


def test_the_parity_prose_gives_each_seed_and_the_bootstrap_at_the_equal_budget(references):
    """The 3000-update finding: each of ours' seeds on val and test2016, and ours - fairseq with
    the paired bootstrap's p as the block computes it from the committed translations, both
    differences inside the margin as point estimates."""
    mine, other = _equal_budget_groups()[parity.WU_RECIPE]
    margin = parity.EQUIVALENCE_MARGIN
    assert all(abs(d) < margin for d in _ours_minus_fairseq(mine, other).values())
    assert (
        f": val {_seed_scores(mine, 'val')}, test2016 {_seed_scores(mine, 'test_2016_flickr')} "
        f"lowercased. Against fairseq's {NUMBER_WORDS[len(other)]} seeds: ours - fairseq "
        f"{_difference_with_p(mine, other, references)}, both point estimates within {margin}."
    ) in _parity_pages()


def test_the_parity_prose_gives_wu_et_al_s_budget_runs_as_recorded(references):
    """The full-budget finding: the budget and patience of both systems' records, each side's
    machine and precision, where each run stopped, ours' averaged checkpoints, each seed's
    lowercased BLEU (tokenized lowercased the same at the prose's rounding), fairseq's own
    BLEU4, ours - fairseq over the seed pair with the block's paired bootstrap (named as a
    comparison of runs, not systems), every run at or above the literature's test2016 score as
    a point estimate, and the 95% t-interval of ours' seed mean (scipy), which holds it, named
    as pooling two machines where its runs ran on two."""
    ours, fairseq = _preset_runs(WU_BUDGET)
    mine, other = _equal_budget_groups(WU_BUDGET)[parity.WU_RECIPE]
    (theirs,) = fairseq
    assert all(r.updates < r.max_updates for r in ours + fairseq), "a run did not stop early"
    rows = [row for changes, row in _wu_rows()
            if not changes and row["params"]["train"]["max_steps"] == WU_BUDGET]  # fmt: skip
    assert sorted(row["params"]["seed"] for row in rows) == [r.seed for r in ours]
    (patience,) = {row["params"]["train"]["early_stopping_patience"] for row in rows} | {
        payload["recipe"]["patience"] for payload in _fairseq_records()
        if payload["recipe"]["max_update"] == WU_BUDGET
    }  # fmt: skip
    (averaged,) = {row["eval.json"]["checkpoints_averaged"] for row in rows}
    (precision,) = {_machine(r)[1] for r in ours}
    where = " and ".join(f"seed {r.seed} on {_machine(r)[0]}" for r in ours)
    fairseq_where, fairseq_precision = _machine(theirs)
    test = "test_2016_flickr"
    assert all(f"{r.scores[test]['bleu_tok_lc']:.1f}" == f"{r.scores[test]['bleu_lc']:.1f}"
               for r in ours)  # fmt: skip
    literature = parity.LITERATURE_TEST_BLEU
    assert all(r.scores[test]["bleu_lc"] >= literature for r in ours + fairseq)
    seeds = [r.scores[test]["bleu_lc"] for r in ours]
    low, high = stats.t.interval(0.95, len(seeds) - 1, loc=statistics.fmean(seeds),
                                 scale=stats.sem(seeds))  # fmt: skip
    assert low < literature < high
    stopped = " and ".join(f"{r.updates} (seed {r.seed})" for r in ours)
    pooled = ("" if len({_machine(r)[0] for r in ours}) == 1 else
              " (its runs on two machines, which a study's comparison never pools)")  # fmt: skip
    assert (
        f"({WU_BUDGET} updates allowed, `--patience {patience}`; ours, {where}, both in "
        f"{precision}; fairseq on {fairseq_where} in {fairseq_precision}): validation loss "
        f"stopped improving and training stopped at update {stopped}; the last {averaged} "
        f"epoch checkpoints averaged give test2016 {_seed_scores(ours, test)} lowercased "
        f"(tokenized lowercased, their metric: the same), val {_seed_scores(ours, 'val')}. "
        f"fairseq, seed {theirs.seed}, stopped at update {theirs.updates}: test2016 "
        f"{theirs.scores[test]['bleu_lc']:.1f} (fairseq's own BLEU4 "
        f"{theirs.scores[test]['fairseq_bleu4']['bleu4']:.2f}), val "
        f"{theirs.scores['val']['bleu_lc']:.1f}. Ours - fairseq over this "
        f"{NUMBER_WORDS[len(mine)]} seed pair: {_difference_with_p(mine, other, references)}, "
        f"p from the paired bootstrap over sentences, which sees only how the test sentences "
        f"were sampled: with one seed a side there is no seed-level interval, so this compares "
        f"the two runs, not the two systems. Every run scores at or above the literature's "
        f"{literature} as a point estimate; the 95% interval of ours' "
        f"{NUMBER_WORDS[len(seeds)]}-seed mean, "
        f"{low:.1f}-{high:.1f}{pooled}, does not show the preset reaching it."
    ) in _parity_pages()


def _updates_per_epoch(records: list[tuple[int, int]]) -> int:
    """The one number of updates per epoch U that every (updates, epochs started) record
    allows: a run's last epoch may be cut short by its budget, so
    (epochs - 1) * U < updates <= epochs * U."""
    allowed = set.intersection(*(
        set(range(math.ceil(updates / epochs), math.ceil(updates / (epochs - 1))))
        for updates, epochs in records
    ))  # fmt: skip
    (per_epoch,) = allowed
    return per_epoch


def test_the_settings_table_states_the_earlier_batch_budgets_epochs_and_tokens_per_update():
    """The batching row: the earlier budget's bound as its rows recorded it, the updates per
    epoch that ours' rows under it and fairseq's runs allow (updates and epochs started of each
    record), and how many more target tokens per update ours trained on, over all of those
    rows against all of fairseq's runs."""
    earlier = "train.batch_budget sum"
    rows = [row for changes, row in _wu_rows() if earlier in changes]
    (max_tokens,) = {row["params"]["train"]["max_tokens"] for row in rows}
    ours_per_epoch = _updates_per_epoch(
        [(row["train.json"]["steps"], row["train.json"]["epochs"]) for row in rows]
    )
    fairseq_per_epoch = _updates_per_epoch(
        [(payload["updates"], payload["epochs"]) for payload in _fairseq_records()]
    )
    ours = [r for r in _committed_runs() if r.system == "ours" and earlier in r.recipe]
    fairseq = [r for r in _committed_runs() if r.system.startswith("fairseq")]
    assert len(ours) == len(rows)
    per_update = [sum(r.target_tokens for r in runs) / sum(r.updates for r in runs)
                  for runs in (ours, fairseq)]  # fmt: skip
    more = per_update[0] / per_update[1] - 1
    assert (
        f"B * (source + target + 1) <= {max_tokens}, made {ours_per_epoch} updates per epoch "
        f"against fairseq's {fairseq_per_epoch} and trained on {more:.0%} more target tokens "
        "per update"
    ) in _parity_pages()


def test_the_settings_table_states_test2016_lengths_under_each_length_normalization(references):
    """The length-normalization row: the output length over the reference length on test2016
    (the tokens of lowercased BLEU, the block's pooled ratio) of ours decoded with GNMT's
    normalization and of the fairseq runs it is paired with, and of the preset as it is, which
    decodes with fairseq's, at the equal budget."""
    groups = _equal_budget_groups()
    (gnmt,) = [recipe for recipe in groups if recipe.endswith("eval.length_normalization gnmt")]
    test = "test_2016_flickr"

    def ratio(runs):
        return parity._pooled_length_ratio([r.translations(test) for r in runs], references[test])

    mine, other = groups[gnmt]
    preset, _ = groups[parity.WU_RECIPE]
    assert (
        f"ours wrote test2016 at {ratio(mine):.3f} of the reference length against fairseq's "
        f"{ratio(other):.3f}; with fairseq's, {ratio(preset):.3f}"
    ) in _parity_pages()


def test_the_decoding_paragraph_quotes_one_model_decoded_by_both_searches():
    """The paragraph on decoding: the first model the block decodes by both searches, as its
    decode_checkpoint record gives it: the translations the same on each split, the BLEU
    difference with its paired bootstrap, each search's length cap, and the model ranking
    fairseq's translation higher wherever the two differ."""
    decoded = parity.decoding_results(REPO_ROOT / parity.PARITY_DIR)
    (path, payload), (next_path, _) = decoded[:2]
    val, test = (payload["splits"][split] for split in SPLITS)
    for entry in (val, test):
        ranked, differing = entry["model_score"], entry["sentences"] - entry["identical_hypotheses"]
        assert (ranked["ours_higher"], ranked["fairseq_higher"]) == (0, differing), path
    ours, fairseq = payload["searches"]["ours"], payload["searches"]["fairseq"]
    assert fairseq["max_len_a"] == 0
    (others,) = {NUMBER_WORDS[e["sentences"] - e["identical_hypotheses"] - 1] for e in (val, test)}
    val_paired, test_paired = val["paired_bootstrap_bleu_lc"], test["paired_bootstrap_bleu_lc"]
    seed, next_seed = (re.search(r"_seed(\d+)\.json$", str(p))[1] for p in (path, next_path))
    assert (
        f"The seed {seed} model decoded by fairseq 0.12's own `SequenceGenerator` "
        f"(`python -m benchmarks.fairseq.decode_checkpoint`: our weights in fairseq's "
        f"`TransformerModel`, its logits checked equal to ours first): "
        f"{val['identical_hypotheses']} of {val['sentences']} val and "
        f"{test['identical_hypotheses']} of {test['sentences']} test2016 translations are the "
        f"same word for word, BLEU {val_paired['ours_minus_fairseq']:+.2f} "
        f"(p = {val_paired['p_value']:.3f}) and {test_paired['ours_minus_fairseq']:+.2f} (the "
        f"block's first decoding line; the line after it is the seed {next_seed} model's). Where they differ, fairseq's search returned the "
        "translation the model ranks higher: on each split one is an output caught in a "
        f"repeating loop that our length cap ({ours['max_len_a']} |x| + {ours['max_len_b']}) "
        f"stops earlier than fairseq's ({fairseq['max_len_b']}), the other {others} near ties"
    ) in _parity_pages()
