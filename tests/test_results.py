"""README's Results table comes from the committed runs' metrics files, never typed by hand."""

from __future__ import annotations

import functools
import json
import re

import pytest
import yaml

from pipeline import docs_blocks, results
from pipeline.environment import lock_hash
from pipeline.errors import DataError
from tests.conftest import NUMBER_WORDS, REPO_ROOT


def _finished_run(directory, bleu_lc: float, src="en", tgt="de", case_fold=False, bleu_lc_ci=None):
    metrics = directory / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "prepare.json").write_text(json.dumps({"src_lang": src, "tgt_lang": tgt}))
    (metrics / "tokenize.json").write_text(json.dumps({"vocab_size": 10000}))
    train = {"num_parameters": 2_600_000, "wall_time_s": 2940.0, "precision": "bf16-mixed"}
    (metrics / "train.json").write_text(json.dumps(train))
    evaluation = {
        "val": {"bleu": 40.04, "bleu_lc": 40.24},
        "test_2016_flickr": {
            "bleu": 39.94,
            "bleu_lc": bleu_lc,
            "chrf": 67.25,
            "bleu_tok_lc": 41.97,
            **({} if bleu_lc_ci is None else {"bleu_lc_ci": bleu_lc_ci}),
        },
        "signatures": {"bleu_lc": "nrefs:1|case:lc|tok:13a", "bleu": "nrefs:1|case:mixed"},
        "wall_time_s": 150.0,
    }
    (metrics / "eval.json").write_text(json.dumps(evaluation))
    params = {
        "experiment_name": "multi30k_tiny",
        "data": {"src_lang": src, "tgt_lang": tgt, "tokenizer": {"case_fold": case_fold}},
        "eval": {"average": 3, "average_by": "last", "length_penalty": 2.4},
    }
    (directory / "params.yaml").write_text(yaml.safe_dump(params))
    hypotheses = directory / "eval"
    hypotheses.mkdir()
    for split in ("val", "test_2016_flickr"):
        (hypotheses / f"{split}.hyp").write_text(f"{split}: Ein Hund rennt.\n", encoding="utf-8")
    return metrics, directory / "params.yaml"


def test_recorded_rows_render_their_own_numbers(tmp_path):
    root = tmp_path / "results"
    runs = (
        ("a.en-de", 41.26, "en", "de", False, None),
        ("b.de-en", 43.51, "de", "en", True, 1.6362),
    )
    for name, bleu_lc, src, tgt, case_fold, ci in runs:
        metrics, params = _finished_run(tmp_path / name, bleu_lc, src, tgt, case_fold, ci)
        results.record(name, "make repro", metrics, params, root, tmp_path / name / "eval")
    rows = results.load_rows(root)
    assert [r["name"] for r in rows] == ["a.en-de", "b.de-en"]
    block = results.table(rows)
    lines = block.splitlines()
    assert lines[0].startswith("| recipe |") and "<!--" not in block
    first, second = lines[2], lines[3]
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[:9] == [
        "multi30k_tiny", "en->de", "last 3, 2.4", "41.3", "39.9", "42.0", "67.2", "40.2", "2.60 M"
    ]  # fmt: skip
    assert (
        cells[9] == "49.0 min + 2.5 min"
        and "bf16-mixed" in cells[10]
        and cells[11] == "`make repro`"
    )
    # A run that measured the bootstrap interval shows it beside its BLEU (lc)
    assert "| multi30k_tiny, case-folded | de->en" in second and "| 43.5 ± 1.6 |" in second
    assert "- `bleu_lc`: `nrefs:1|case:lc|tok:13a`" in block
    run = json.loads((root / "a.en-de" / "run.json").read_text())
    assert run["command"] == "make repro" and "cores" in run["hardware"]
    assert run["environment_lock"] == lock_hash() and run["commit"]
    # The row keeps the run's hypotheses, one file per split, as the run wrote them
    for split in ("val", "test_2016_flickr"):
        kept = root / "b.de-en" / f"{split}.hyp"
        assert kept.read_text(encoding="utf-8") == f"{split}: Ein Hund rennt.\n"


def test_record_refuses_an_unfinished_run_naming_the_missing_file(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.0)
    (metrics / "eval.json").unlink()
    with pytest.raises(DataError, match="eval.json"):
        results.record("x", "make repro", metrics, params, tmp_path / "results")


def test_a_run_made_on_another_machine_keeps_that_machines_provenance(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.0)
    there = {"commit": "abc1234", "hardware": "NVIDIA H100 80GB HBM3 x 1",
             "environment_lock": "0123456789abcdef", "environment_differences": 40}  # fmt: skip
    (tmp_path / "made_on.json").write_text(json.dumps(there))
    results.cli(["--root", str(tmp_path / "results"), "record", "gpu.en-de", "--command", "c",
                 "--metrics-dir", str(metrics), "--params", str(params),
                 "--eval-dir", str(tmp_path / "run" / "eval"),
                 "--made-on", str(tmp_path / "made_on.json")])  # fmt: skip
    run = json.loads((tmp_path / "results" / "gpu.en-de" / "run.json").read_text())
    assert {key: run[key] for key in there} == there
    here = results.record("cpu.en-de", "c", metrics, params, tmp_path / "results")
    assert json.loads((here / "run.json").read_text())["hardware"] != there["hardware"]


def test_a_password_in_the_recorded_command_is_masked(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.0)
    command = "python -m pipeline.sweep s.yaml --storage postgresql://me:s3cret-pw@db/studies"
    row = results.record("pw.en-de", command, metrics, params, tmp_path / "results")
    run = json.loads((row / "run.json").read_text())
    assert run["command"] == command.replace("s3cret-pw", "***")


def test_the_docs_results_table_and_readme_headline_are_the_committed_runs_tables():
    rows = results.load_rows(REPO_ROOT / "results")
    hint = "run `python -m pipeline.results table --update-docs`"
    table = docs_blocks.read(REPO_ROOT / results.TABLE_PAGE, results.BLOCK)
    assert table == results.table(rows), hint
    headline = results.headline(rows, REPO_ROOT / "results")
    assert docs_blocks.read(REPO_ROOT / "README.md", results.HEADLINE_BLOCK) == headline, hint


def test_readmes_lock_sentence_holds_for_every_headline_row():
    """README: each result's record names the lock it ran with, and the GPU rows' records
    count the packages that differed from it. Each headline row's record says so: a CPU row
    ran installed from its lock (no differences), a GPU row counts its own."""
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert "Each result's record names the lock it ran with (its hash)" in readme
    assert "their records count the packages that differed from that lock" in readme
    folders = (REPO_ROOT / "results" / results.HEADLINE_FILE).read_text().split()
    runs = [json.loads((REPO_ROOT / "results" / f / "run.json").read_text()) for f in folders]
    assert any("NVIDIA" in run["hardware"] for run in runs)
    for folder, run in zip(folders, runs):
        on_gpu = "NVIDIA" in run["hardware"]
        assert (run.get("environment_differences", 0) > 0) == on_gpu, folder
        assert run["environment_lock"], folder


def test_table_update_docs_rewrites_only_its_blocks(tmp_path, capsys):
    metrics, params = _finished_run(tmp_path / "run", 41.26)
    results.record("a.en-de", "make repro", metrics, params, tmp_path / "results")
    results.record("b.en-de", "x", metrics, params, tmp_path / "results", tmp_path / "run" / "eval")
    (tmp_path / "results" / results.HEADLINE_FILE).write_text("b.en-de\n")
    pages = {
        tmp_path / results.TABLE_PAGE: results.BLOCK,
        tmp_path / "README.md": results.HEADLINE_BLOCK,
    }
    for page, block in pages.items():
        begin, end = docs_blocks.markers(block)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"# Title\n\n{begin}\nstale row\n{end}\n\nAfter.\n")
    results.cli(["--root", str(tmp_path / "results"), "table", "--update-docs", str(tmp_path)])
    printed = capsys.readouterr().out
    for page in pages:
        text = page.read_text()
        assert "stale row" not in text and text.startswith("# Title\n\n")
        assert text.endswith("\nAfter.\n")
    assert docs_blocks.read(tmp_path / results.TABLE_PAGE, results.BLOCK) == printed
    assert "| 41.3 |" in printed and printed.count("| en->de |") == 2
    headline = docs_blocks.read(tmp_path / "README.md", results.HEADLINE_BLOCK)
    assert headline.startswith("| recipe | direction | test2016 BLEU (lc) | val BLEU (lc) |")
    assert headline.count("| en->de |") == 1 and "`x`" in headline  # b alone, as listed


def test_a_headline_naming_an_unrecorded_row_is_an_error_naming_it(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.26)
    results.record("a.en-de", "make repro", metrics, params, tmp_path / "results")
    (tmp_path / "results" / results.HEADLINE_FILE).write_text("a.en-de\ngone.en-de\n")
    rows = results.load_rows(tmp_path / "results")
    with pytest.raises(results.DataError, match="headline.txt: no recorded row gone.en-de"):
        results.headline(rows, tmp_path / "results")


def test_a_row_shows_the_command_a_user_types_where_another_ran_it(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.26)
    row = results.record("a.en-de", "runner start 'job'", metrics, params, tmp_path / "results")
    run = json.loads((row / "run.json").read_text())
    assert "`runner start 'job'`" in results.table(results.load_rows(tmp_path / "results"))
    (row / "run.json").write_text(json.dumps({**run, "reproduce": "dvc exp run -S seed=1"}))
    text = results.table(results.load_rows(tmp_path / "results"))
    assert "`dvc exp run -S seed=1`" in text and "runner" not in text


def test_record_takes_the_target_tokens_from_train_json_else_from_the_last_checkpoint(tmp_path):
    import torch

    from pipeline.training.checkpoints import LAST_NAME

    metrics, params = _finished_run(tmp_path / "old", 41.0)  # trained before train.json had them
    train = json.loads((metrics / "train.json").read_text())
    (metrics / "train.json").write_text(json.dumps({**train, "checkpoint_dir": "models/ckpt"}))
    checkpoints = tmp_path / "old" / "models" / "ckpt"
    checkpoints.mkdir(parents=True)
    checkpoint = {"state_dict": {}, "global_step": 3000, "hyper_parameters": {},
                  "run_totals": {"train_tokens": 20_687_431.0}}  # fmt: skip
    torch.save(checkpoint, checkpoints / LAST_NAME)
    results.record("old", "make repro", metrics, params, tmp_path / "results")
    assert (
        json.loads((tmp_path / "results/old/run.json").read_text())["target_tokens"] == 20_687_431
    )

    metrics, params = _finished_run(tmp_path / "new", 41.0)
    train = json.loads((metrics / "train.json").read_text())
    (metrics / "train.json").write_text(json.dumps({**train, "train/target_tokens": 1234}))
    results.record("new", "make repro", metrics, params, tmp_path / "results")
    assert json.loads((tmp_path / "results/new/run.json").read_text())["target_tokens"] == 1234


def _flat(path) -> str:
    """A page's text with its line breaks and runs of spaces made single spaces."""
    return " ".join(path.read_text(encoding="utf-8").split())


@functools.cache
def _committed_rows() -> dict[str, dict]:
    """The committed results rows by name, loaded once (the tests only read them)."""
    return {row["name"]: row for row in results.load_rows(REPO_ROOT / "results")}


def _default_recipe_rows() -> list[dict]:
    return [
        row
        for row in _committed_rows().values()
        if row[results.RUN_FILE]["command"] == "make repro"
    ]


def test_readme_states_the_default_recipes_range_over_every_recorded_run_of_it():
    """README's sentence on the default recipe spans every recorded `make repro` row: its
    test2016 BLEU, its training wall time, the cores and the precision of the machines."""
    rows = _default_recipe_rows()
    scores = [row["eval.json"][results.TEST_SPLIT]["bleu_lc"] for row in rows]
    train_min = [row["train.json"]["wall_time_s"] / 60 for row in rows]
    (cores,) = {re.search(r"(\d+) cores", row[results.RUN_FILE]["hardware"])[1] for row in rows}
    (precision,) = {row["train.json"]["precision"] for row in rows}
    (parameters,) = {row["train.json"]["num_parameters"] for row in rows}
    readme = _flat(REPO_ROOT / "README.md")
    assert f"(`make repro`, Transformer-tiny, {parameters / 1e6:.1f} M parameters)" in readme
    assert (
        f"reaches {min(scores):.1f}-{max(scores):.1f} over {NUMBER_WORDS[len(rows)]} runs, "
        f"training in {min(train_min):.0f}-{max(train_min):.0f} min on "
        f"{NUMBER_WORDS[int(cores)]} CPU cores"
    ) in readme
    assert f"(AMD EPYC or Intel Xeon, {precision})" in readme


def test_the_results_page_states_the_default_recipes_wall_times_over_its_runs():
    rows = _default_recipe_rows()
    train_min = [row["train.json"]["wall_time_s"] / 60 for row in rows]
    eval_min = [row["eval.json"]["wall_time_s"] / 60 for row in rows]
    (steps,) = {row["params"]["train"]["max_steps"] for row in rows}
    (precision,) = {row["train.json"]["precision"] for row in rows}
    page = _flat(REPO_ROOT / results.PAGE)
    assert f"trains {steps} updates and evaluates. Over the {NUMBER_WORDS[len(rows)]} " in page
    assert (
        f"training took {min(train_min):.0f}-{max(train_min):.0f} min and evaluation "
        f"{min(eval_min):.1f}-{max(eval_min):.1f} min"
    ) in page
    assert f"with bf16 instructions) in {precision}" in page


def test_the_results_page_quotes_the_default_recipes_decoding_search():
    """The recipe's decoding settings are the best of the committed search on val, and the
    page gives that score and the range of the others."""
    row = REPO_ROOT / "results" / "multi30k_tiny.en-de"
    search = json.loads((row / "decoding_search.json").read_text())
    decoding = yaml.safe_load((row / "params.yaml").read_text())["eval"]
    chosen = (decoding["average"], decoding["length_penalty"])
    scores = {(r["average"], r["length_penalty"]): r[search["metric"]] for r in search["rows"]}
    others = [score for setting, score in scores.items() if setting != chosen]
    assert search["split"] == "val" and scores[chosen] > max(others)
    assert (
        f"(last {chosen[0]}, {chosen[1]}) is the best on val ({scores[chosen]:.2f} lowercased; "
        f"{min(others):.2f}-{max(others):.2f} for the others)"
    ) in _flat(REPO_ROOT / results.PAGE)


def test_every_headline_row_has_its_hypotheses_committed():
    """Each number on README's front table can be rescored: its row's translations are there."""
    root = REPO_ROOT / "results"
    names = (root / results.HEADLINE_FILE).read_text().split()
    assert names
    for name in names:
        for hypotheses in results.HYPOTHESES:
            assert (root / name / hypotheses).stat().st_size > 0, f"{name}: no {hypotheses}"
    # and the full table marks each row that cannot be rescored
    page = docs_blocks.read(REPO_ROOT / results.TABLE_PAGE, results.BLOCK)
    bare = [p for p in root.iterdir() if (p / results.RUN_FILE).exists()
            and not all((p / h).exists() for h in results.HYPOTHESES)]  # fmt: skip
    assert bare and page.count(f"| {results.NOT_RESCORABLE} |") == len(bare)


def test_a_headline_naming_a_row_without_hypotheses_is_an_error_naming_it(tmp_path):
    metrics, params = _finished_run(tmp_path / "run", 41.26)
    results.record("kept.en-de", "make repro", metrics, params, tmp_path / "results",
                   tmp_path / "run" / "eval")  # fmt: skip
    results.record("bare.en-de", "make repro", metrics, params, tmp_path / "results")
    rows = results.load_rows(tmp_path / "results")
    assert results.table(rows).count(f"| {results.NOT_RESCORABLE} |") == 1
    (tmp_path / "results" / results.HEADLINE_FILE).write_text("kept.en-de\n")
    assert "| 41.3 |" in results.headline(rows, tmp_path / "results")
    (tmp_path / "results" / results.HEADLINE_FILE).write_text("kept.en-de\nbare.en-de\n")
    with pytest.raises(DataError, match=r"headline.txt: bare.en-de .* has no val.hyp"):
        results.headline(rows, tmp_path / "results")


def _bleu_lc(rows: dict[str, dict]) -> dict[str, dict[str, float]]:
    """{run name: {'val' and the test split: BLEU (lc)}} of `rows` (by name)."""
    splits = ("val", results.TEST_SPLIT)
    return {name: {s: row["eval.json"][s]["bleu_lc"] for s in splits} for name, row in rows.items()}


# The variants table of docs/results.md: each row's first words, and the record it quotes
VARIANT_RECORDS = {
    "the recipe (`make repro`)": "multi30k_tiny.en-de",
    "Adam betas (0.9, 0.999)": "multi30k_tiny_betas999.en-de",
    "source eos and a 2000-update cool-down": "multi30k_tiny_srceos_cooldown.en-de",
    "attention and activation dropout 0.1": "multi30k_tiny_attdrop.en-de",
    "16384-token batches": "multi30k_tiny_batch16k.en-de",
    "case-folded": "multi30k_tiny_casefold.en-de",
    "de->en, 6000 updates": "multi30k_tiny.de-en",
}


def test_the_variants_table_quotes_each_variants_record():
    """Each variant's val and test2016 BLEU (lc) cells, and the figures its last cell compares
    with the recipe, are its record's."""
    rows = _committed_rows()
    lines = (REPO_ROOT / results.PAGE).read_text(encoding="utf-8").splitlines()
    recipe = rows[VARIANT_RECORDS["the recipe (`make repro`)"]]
    lc = _bleu_lc(rows)
    cells = {}
    for start, name in VARIANT_RECORDS.items():
        (line,) = [line for line in lines if line.startswith(f"| {start}")]
        cells[name] = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert cells[name][1:3] == [f"{lc[name]['val']:.1f}", f"{lc[name][results.TEST_SPLIT]:.1f}"]
    base = lc[recipe["name"]]
    betas = rows["multi30k_tiny_betas999.en-de"]["train.json"]
    assert (
        f"best greedy val BLEU {betas['val/greedy_bleu']:.2f} (update {betas['best_step']}) against "
        f"the recipe's {recipe['train.json']['val/greedy_bleu']:.2f}"
    ) in cells["multi30k_tiny_betas999.en-de"][3]
    folded = lc["multi30k_tiny_casefold.en-de"]
    cased = rows["multi30k_tiny_casefold.en-de"]["eval.json"][results.TEST_SPLIT]["bleu"]
    assert (
        f"{folded['val'] - base['val']:+.2f} on val and "
        f"{folded[results.TEST_SPLIT] - base[results.TEST_SPLIT]:+.2f} on test lowercased; "
        f"its cased BLEU, {cased:.1f},"
    ) in cells["multi30k_tiny_casefold.en-de"][3]
    eos = lc["multi30k_tiny_srceos_cooldown.en-de"]
    last = rows["multi30k_tiny_srceos_cooldown.en-de"]["train.json"]["last"]
    assert (
        f"(val loss {last['val/loss']:.2f} against {recipe['train.json']['last']['val/loss']:.2f}, "
        f"greedy val BLEU {last['val/greedy_bleu']:.2f} against "
        f"{recipe['train.json']['last']['val/greedy_bleu']:.2f})"
    ) in cells["multi30k_tiny_srceos_cooldown.en-de"][3]
    gain, fall = eos["val"] - base["val"], base[results.TEST_SPLIT] - eos[results.TEST_SPLIT]
    assert gain > 0 and fall > 0
    assert (
        f"val is {gain:.2f} higher and test {fall:.1f} lower: one run a side, so neither is a "
        f"finding about the change. Searched again on val, the decoding settings stay "
        f"{_best_decoding('multi30k_tiny_srceos_cooldown.en-de')}"
    ) in cells["multi30k_tiny_srceos_cooldown.en-de"][3]
    recipe_last = recipe["train.json"]["last"]
    attdrop = rows["multi30k_tiny_attdrop.en-de"]["train.json"]["last"]
    assert (
        f"without them training loss ends below val loss ({recipe_last['train/loss']:.2f} against "
        f"{recipe_last['val/loss']:.2f}); with them this one run ended with last-checkpoint val "
        f"loss {attdrop['val/loss']:.2f} and greedy val BLEU {attdrop['val/greedy_bleu']:.2f} (the "
        f"recipe: {recipe_last['val/loss']:.2f} and {recipe_last['val/greedy_bleu']:.2f}). Its best "
        f"decoding on val is {_best_decoding('multi30k_tiny_attdrop.en-de')}"
    ) in cells["multi30k_tiny_attdrop.en-de"][3]
    batch16k = rows["multi30k_tiny_batch16k.en-de"]["train.json"]
    assert (
        f"best greedy val BLEU {batch16k['val/greedy_bleu']:.1f} against "
        f"{recipe['train.json']['val/greedy_bleu']:.1f}"
    ) in cells["multi30k_tiny_batch16k.en-de"][3]
    wu = _tokens_per_update("multi30k_wu2021_subword_nmt_8000_init_seed1_h200.en-de")
    default = _tokens_per_update("multi30k_tiny_rerun.en-de")
    assert (
        f"holds {wu / default:.2f}x the recipe's target tokens per update "
        f"({wu:.0f} against {default:.0f})"
    ) in cells["multi30k_tiny_batch16k.en-de"][3]


def _best_decoding(name: str) -> str:
    """'(last N, penalty)': the best setting on val of a run's committed decoding search."""
    search = json.loads((REPO_ROOT / "results" / name / "decoding_search.json").read_text())
    assert search["split"] == "val"
    best = max(search["rows"], key=lambda row: row[search["metric"]])
    return f"(last {best['average']}, {best['length_penalty']})"


def _wu_budget_rows() -> list[dict]:
    """The Wu et al. preset's two seeds at their budget, seed 1 first."""
    return [_committed_rows()[f"multi30k_wu2021_subword_nmt_8000_init_{run}.en-de"]
            for run in ("seed1_h200", "seed2_cpu")]  # fmt: skip


def _tokens_per_update(name: str) -> float:
    train = _committed_rows()[name]["train.json"]
    return train["train/target_tokens"] / train["steps"]


def _wu_budget_where(rows: list[dict]) -> str:
    """Where the Wu preset's two seeds ran, as README and docs/results.md name it: each run's
    device (a GPU's name, a CPU's class) and whether their commits differ."""
    gpu, cpu = (row[results.RUN_FILE]["hardware"] for row in rows)
    commits = {row[results.RUN_FILE]["commit"] for row in rows}
    assert len(commits) == 2, "the two seeds ran at two commits"
    return (
        f"one seed ran on an {gpu.split(' x ')[0]} and the other on an {cpu.split(',')[0]} CPU "
        "at another commit, so they are two runs, not a mean with an interval"
    )


def test_readme_gives_the_wu_presets_two_seeds_without_pooling_their_machines():
    """README's Wu et al. preset at their budget: both seeds' test2016 BLEU (lc), and no
    interval of their mean: one ran on a GPU, the other on a CPU at another commit, which the
    project never pools."""
    rows = _wu_budget_rows()
    seeds = [row["eval.json"][results.TEST_SPLIT]["bleu_lc"] for row in rows]
    readme = _flat(REPO_ROOT / "README.md")
    assert (
        f"scores {seeds[0]:.1f} and {seeds[1]:.1f} at their budget over two seeds, against their "
        f"published 41.0: {_wu_budget_where(rows)}"
    ) in readme
    assert "interval of the mean" not in readme


def test_the_docs_index_quotes_each_recorded_make_repro_training_time():
    """docs/index.md's 'how long' rows: each training time is its named record's wall time."""
    rows = _committed_rows()
    minutes = {name: f"{rows[name]['train.json']['wall_time_s'] / 60:.0f}" for name in (
        "multi30k_tiny.en-de", "multi30k_tiny_rerun2.en-de", "multi30k_tiny_rerun.en-de",
        "multi30k_tiny_amx.en-de", "multi30k_tiny_batch16k.en-de")}  # fmt: skip
    first, second, shared, amx, batch16k = minutes.values()
    named = [f"`results/{name}`" for name in minutes]
    page = _flat(REPO_ROOT / "docs/index.md")
    assert (
        f"| {first} and {second} min of training, {shared} on a machine shared with other jobs "
        f"({', '.join(named[:3])}) |"
    ) in page
    assert f"| {amx} min of training ({named[3]}) |" in page
    assert f"{batch16k} min of training for the same token budget in 16k-token batches" in page
    assert f"({named[4]}) |" in page


def test_the_results_pages_reading_of_the_recipe_runs_and_the_literature_is_the_records():
    """docs/results.md around its variants table: the recipe runs' spread, the rerun on another
    machine, scoring's agreement on the 16384-token row, the variants' range, that one
    run's sentence bootstrap is no test of the gap to the literature, where the Wu et al. preset's
    two seeds ran, and fairseq's own score at Wu et al.'s budget."""
    rows = _committed_rows()
    recipe = _default_recipe_rows()
    lc = _bleu_lc(rows)
    test = [lc[row["name"]][results.TEST_SPLIT] for row in recipe]
    greedy = [row["train.json"]["val/greedy_bleu"] for row in recipe]
    page = _flat(REPO_ROOT / results.PAGE)
    assert (
        f"the recipe's own {NUMBER_WORDS[len(recipe)]} runs already spread over test2016 "
        f"{min(test):.1f}-{max(test):.1f} and best greedy val BLEU "
        f"{min(greedy):.1f}-{max(greedy):.1f}"
    ) in page

    first, again = (
        rows["multi30k_tiny.en-de"]["eval.json"],
        rows["multi30k_tiny_amx.en-de"]["eval.json"],
    )
    assert (
        f"test2016 {again[results.TEST_SPLIT]['bleu_lc']:.1f} ± "
        f"{again[results.TEST_SPLIT]['bleu_lc_ci']:.1f} and val {again['val']['bleu_lc']:.1f}, "
        f"against {first[results.TEST_SPLIT]['bleu_lc']:.1f} and {first['val']['bleu_lc']:.1f}"
    ) in page

    batch16k = rows["multi30k_tiny_batch16k.en-de"]["eval.json"]
    tok, sacre = ({s: batch16k[s][key] for s in ("val", results.TEST_SPLIT)}
                  for key in ("bleu_tok_lc", "bleu_lc"))  # fmt: skip
    assert max(abs(tok[s] - sacre[s]) for s in tok) < 0.05
    assert (
        f"agree within 0.05 (test2016 {tok[results.TEST_SPLIT]:.2f} against "
        f"{sacre[results.TEST_SPLIT]:.2f}, val {tok['val']:.2f} against {sacre['val']:.2f}"
    ) in page

    recipe_names = {row["name"] for row in recipe}
    variants = [lc[name][results.TEST_SPLIT] for name in VARIANT_RECORDS.values()
                if name not in recipe_names and name.endswith(".en-de")]  # fmt: skip
    assert f"the en->de variants above ({min(variants):.1f}-{max(variants):.1f})" in page

    # one system's sentence bootstrap is said to be no test of the gap to the literature
    assert "contain 41.0" not in page
    assert "not whether it differs from a score published from other runs" in page

    wu_rows = _wu_budget_rows()
    assert all(row["train.json"]["steps"] < row["params"]["train"]["max_steps"] for row in wu_rows)
    wu = [row["train.json"] for row in wu_rows]
    default = rows["multi30k_tiny_rerun.en-de"]["train.json"]["train/target_tokens"]
    assert (
        f"it stopped early after {wu[0]['steps']} and {wu[1]['steps']} updates and "
        f"{wu[0]['train/target_tokens'] / 1e6:.1f} and {wu[1]['train/target_tokens'] / 1e6:.1f} M "
        f"target tokens, {wu[0]['train/target_tokens'] / default:.2f}x and "
        f"{wu[1]['train/target_tokens'] / default:.2f}x the default recipe's {default / 1e6:.1f} M"
    ) in page

    assert (
        f"(the last two rows of the table: `results/multi30k_wu2021_subword_nmt_8000_*`; "
        f"{_wu_budget_where(wu_rows)})"
    ) in page
    fairseq = json.loads((REPO_ROOT / "results/parity/fairseq_wu2021_8000_seed1.json").read_text())
    assert f"shows fairseq itself at {fairseq['scores'][results.TEST_SPLIT]['bleu_lc']:.1f}" in page
