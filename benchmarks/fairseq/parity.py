"""The parity table of docs/parity.md and its comparisons on docs/parity-comparisons.md,
generated from committed results only.

    python -m benchmarks.fairseq.parity                # print both blocks
    python -m benchmarks.fairseq.parity --update-docs  # write them into their pages,
                                                       # and draw results/parity/parity.png

Rows come from two kinds of committed runs:
- fairseq: `results/parity/*.json`, each written by `python -m benchmarks.fairseq.train_peer --out
  results/parity/<name>.json ...` with its detokenized translations beside it
  (`<name>.<split>.hyp`);
- ours: the rows of `python -m pipeline.results record` under `results/` that ran Wu et al.'s
  recipe (`experiment=multi30k_wu2021`), and, for reference, the default recipe's `make repro`
  rows.

Below the table, every budget (updates) that both systems ran is compared: ours minus fairseq
in lowercased BLEU on val and test2016, with sacreBLEU's paired bootstrap (1000 resamples) of
ours against fairseq, the seeds of each system paired in seed order and pooled
(`scoring.pooled_paired_bootstrap`), and the seed-level 90% Welch interval of the difference
(the unit the question is about: a training run), with whether it lies within the parity
margin of +-0.3 BLEU. Settings are chosen on val;
test2016 is reported, never tuned on.

The figure (`parity.png`) shows what the comparison rests on: each seed's lowercased BLEU of
fairseq and of Wu et al.'s preset as it is now (rows of earlier settings left out), per budget
and split, the mean of each group marked, and Wu et al.'s published 41.0 on test2016.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline import docs_blocks, results
from pipeline.cli import main
from pipeline.errors import DataError
from pipeline.evaluation import scoring, seed_stats
from pipeline.metric_names import FORMER_SUMMARY, MEAN_TOKENS_PER_SEC, current_names

PARITY_DIR = results.RESULTS_ROOT / "parity"
WU_RECIPE = "multi30k_wu2021"  # conf/experiment/multi30k_wu2021.yaml
DEFAULT_RECIPE_COMMAND = "make repro"
BLOCK = "parity"  # the table, on PAGE
PAGE = docs_blocks.DOCS / "parity.md"
COMPARISONS_BLOCK = "parity:comparisons"  # ours - fairseq per budget, on COMPARISONS_PAGE
COMPARISONS_PAGE = docs_blocks.DOCS / "parity-comparisons.md"
SPLITS = (results.VAL_SPLIT, results.TEST_SPLIT)
P_METRIC = "bleu_lc"
FIGURE = "parity.png"  # in PARITY_DIR
# Wu et al. (2021), Table 1: their Transformer-tiny on test2016, tokenized lowercased BLEU, one seed
LITERATURE_TEST_BLEU = 41.0
# Parity's margin in BLEU: ours and fairseq count as equal where the seed-level difference is
# shown to lie within +-EQUIVALENCE_MARGIN, i.e. where its two-sided INTERVAL_CONFIDENCE
# interval lies inside it (two one-sided tests at (1 - INTERVAL_CONFIDENCE) / 2 each)
EQUIVALENCE_MARGIN = 0.3
INTERVAL_CONFIDENCE = 0.90


@dataclass
class Run:
    """One trained and evaluated system, as the table shows it."""

    system: str
    experiment: str  # the preset it ran (conf/experiment/), whatever settings it changed
    recipe: str  # the preset and the changed settings the table names
    seed: int
    updates: int
    max_updates: int  # the budget it was given (early stopping may end it sooner)
    target_tokens: int | None
    train_wall_s: float | None
    tokens_per_s: float | None
    scores: dict[str, dict]  # split -> {"bleu_lc": ..., "bleu_tok_lc": ...}
    hardware: str
    command: str
    hypotheses: dict[str, Path]  # split -> detokenized translations

    def translations(self, split: str) -> list[str]:
        path = self.hypotheses.get(split)
        if path is None or not path.exists():
            raise DataError(f"{self.command}: no {split} translations committed ({path})")
        return path.read_text(encoding="utf-8").splitlines()


def fairseq_runs(parity_dir: Path) -> list[Run]:
    """Every committed `benchmarks.fairseq.train_peer` result (smoke runs refused: not a result)."""
    from benchmarks.fairseq import train_peer

    runs = []
    for path in sorted(parity_dir.glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("benchmark") != "fairseq_peer":
            continue
        if payload["smoke"]:
            raise DataError(
                f"{path}: a smoke run (--max-train-pairs/--max-eval-pairs) is no result"
            )
        recipe = payload["recipe"]
        runs.append(Run(
            system=f"fairseq {payload['venv']['versions']['fairseq']}",
            experiment=WU_RECIPE,
            recipe="Wu et al. 2021 (fairseq)",
            seed=recipe["seed"],
            updates=payload["updates"],
            max_updates=recipe["max_update"],
            target_tokens=payload["target_tokens"],
            train_wall_s=payload["wall_s"]["train"],
            tokens_per_s=payload["tokens_per_s"],
            scores=payload["scores"],
            hardware=f"{payload['hardware']}, fp32, {payload['threads']} thread(s)",
            command=payload.get("reproduce")
            or f"python -m benchmarks.fairseq.train_peer {' '.join(payload['command'].split()[3:])}",
            hypotheses={s: train_peer.hypotheses_path(path, s) for s in payload["scores"]},
        ))  # fmt: skip
    return runs


# The settings of Wu et al.'s recipe that its rows are compared under, besides the budget: how
# the text is segmented, how the model starts, how updates are batched and how the model decodes
RECIPE_KEYS = {
    "data": ("tokenizer.model_type",),
    "model": ("init",),
    "train": ("max_tokens", "batch_budget", "accumulate_grad_batches", "loss_normalization"),
    "eval": ("beam_size", "length_penalty", "length_normalization", "max_len_a", "max_len_b",
             "average", "average_by"),
}  # fmt: skip


def recipe_changes(params: dict, preset: dict) -> list[str]:
    """`<section>.<key> <value>` for each setting of RECIPE_KEYS in which a recorded row differs
    from Wu et al.'s `preset` (`wu_preset`; a key the row predates has the default of its
    config dataclass, as it had then)."""
    from pipeline import config, config_schema

    defaults = config.to_dict(config_schema.Config())
    changes = []
    for section, keys in RECIPE_KEYS.items():
        recorded = {**defaults[section], **params.get(section, {})}
        for key in keys:  # a dotted key names a nested setting (data.tokenizer.model_type)
            value = functools.reduce(dict.get, key.split("."), recorded)
            if value != functools.reduce(dict.get, key.split("."), preset[section]):
                changes.append(f"{section}.{key} {value}")
    return changes


def wu_preset() -> dict:
    """Wu et al.'s preset as `conf/` composes it now."""
    from pipeline import config

    return config.to_dict(config.compose([f"experiment={WU_RECIPE}"]))


def our_runs(results_root: Path) -> list[Run]:
    """Our recorded rows of Wu et al.'s recipe, and the default recipe's `make repro` rows. A
    row of Wu et al.'s recipe batched or decoded under other settings than the preset's now
    is named with them (`multi30k_wu2021, eval.length_normalization gnmt`), and compared
    apart from the rows of the recipe as it is."""
    runs, preset = [], None
    for row in results.load_rows(results_root):
        params, train, run = row["params"], row["train.json"], row[results.RUN_FILE]
        experiment = recipe = params["experiment_name"]
        if experiment != WU_RECIPE and run["command"] != DEFAULT_RECIPE_COMMAND:
            continue
        if (params["data"]["src_lang"], params["data"]["tgt_lang"]) != ("en", "de"):
            continue
        if experiment == WU_RECIPE:
            preset = preset or wu_preset()  # composed once, for the first such row
            if changes := recipe_changes(params, preset):
                recipe = ", ".join([recipe, *changes])
        folder = results_root / row["name"]
        runs.append(Run(
            system="ours",
            experiment=experiment,
            recipe=recipe,
            seed=params["seed"],
            updates=train["steps"],
            max_updates=params["train"]["max_steps"],
            target_tokens=run.get("target_tokens"),  # pipeline.results.run_totals
            train_wall_s=train["wall_time_s"],
            tokens_per_s=train[MEAN_TOKENS_PER_SEC],
            scores={s: row["eval.json"][s] for s in SPLITS},
            hardware=f"{run['hardware']}, {train['precision']}",
            command=results.reproduce_command(run),
            hypotheses={s: folder / f"{s}.hyp" for s in SPLITS},
        ))  # fmt: skip
    return runs


DECODING_DIR = "decoding"  # under PARITY_DIR: benchmarks.fairseq.decode_checkpoint results
SEARCH_NAMES = {"ours": "our beam search", "fairseq": "fairseq 0.12's beam search"}


def decoding_results(parity_dir: Path) -> list[tuple[Path, dict]]:
    """Every committed `benchmarks.fairseq.decode_checkpoint` result, by file name."""
    paths = sorted((parity_dir / DECODING_DIR).glob("*.json"))
    loaded = [(path, json.loads(path.read_text(encoding="utf-8"))) for path in paths]
    return [(path, payload) for path, payload in loaded
            if payload.get("benchmark") == "fairseq_decode"]  # fmt: skip


def decoded_runs(parity_dir: Path) -> list[Run]:
    """Our models decoded by both searches (`benchmarks.fairseq.decode_checkpoint`), a row per search:
    named with what differs from Wu et al.'s preset (init, segmentation: the fairseq harness's
    segmented files, or a tokenizer other than the preset's) and, for fairseq's search, with
    that."""
    from benchmarks.fairseq.decode_checkpoint import HARNESS_SUBWORDS, SEARCHES
    from benchmarks.fairseq.train_peer import hypotheses_path

    runs, preset = [], None
    for path, payload in decoding_results(parity_dir):
        run, training = payload["run"], payload.get("training")
        training = training and current_names(training, FORMER_SUMMARY)
        missing = [split for split in SPLITS if split not in payload["splits"]]
        if missing or training is None:
            raise DataError(f"{path}: a row needs both {SPLITS} decoded and a finished "
                            f"training (missing: {missing or 'training'})")  # fmt: skip
        preset = preset or wu_preset()
        named = [run["experiment"]]
        if run["experiment"] == WU_RECIPE and run["init"] != preset["model"]["init"]:
            named.append(f"model.init {run['init']}")
        if run["subwords"] == HARNESS_SUBWORDS:
            named.append(f"{run['subwords']} subwords")
        elif (model_type := run["subwords"]) != preset["data"]["tokenizer"]["model_type"]:
            named.append(f"data.tokenizer.model_type {model_type}")
        command = payload.get("reproduce") or f"{payload['train_command']}; {payload['command']}"
        for search in SEARCHES:
            runs.append(Run(
                system="ours",
                experiment=run["experiment"],
                recipe=", ".join([*named, *([SEARCH_NAMES[search]] if search != "ours" else [])]),
                seed=run["seed"],
                updates=training["steps"],
                max_updates=run["max_steps"],
                target_tokens=training["train/target_tokens"],
                train_wall_s=training["wall_time_s"],
                tokens_per_s=training[MEAN_TOKENS_PER_SEC],
                scores={split: payload["splits"][split]["scores"][search] for split in SPLITS},
                hardware=f"{payload['provenance']['hardware']}, {training['precision']}",
                command=command,
                hypotheses={split: hypotheses_path(path, split, search) for split in SPLITS},
            ))  # fmt: skip
    return runs


def decoding_lines(parity_dir: Path) -> list[str]:
    """One model, two searches: for each committed decode_checkpoint result, ours minus fairseq's
    search per split, how many translations are the same, and which search's translation the
    model itself ranks higher where they differ."""
    lines = []
    for path, payload in decoding_results(parity_dir):
        cells = []
        for split, entry in payload["splits"].items():
            paired, wins = entry["paired_bootstrap_bleu_lc"], entry["model_score"]
            cells.append(
                f"{split} {paired['ours_minus_fairseq']:+.2f} (p = {paired['p_value']:.3f}), "
                f"{entry['identical_hypotheses']} of {entry['sentences']} the same, the model "
                f"ranks ours higher {wins['ours_higher']} times, fairseq's {wins['fairseq_higher']}"
            )
        lines.append(f"- one model (`{path.relative_to(parity_dir.parent.parent)}`), our beam "
                     "search - fairseq's, lowercased BLEU: " + "; ".join(cells))  # fmt: skip
    return lines


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f} M"


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| system | recipe | seed | budget (updates) | updates | target tokens | tokens / update "
        "| training wall time | training tok/s | val BLEU (lc) | val BLEU (tok, lc) "
        "| test2016 BLEU (lc) | test2016 BLEU (tok, lc) | hardware | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        per_update = run.target_tokens / run.updates if run.target_tokens and run.updates else None
        val, test = run.scores[results.VAL_SPLIT], run.scores[results.TEST_SPLIT]
        lines.append(
            f"| {run.system} | {run.recipe} | {run.seed} | {run.max_updates} | {run.updates} "
            f"| {_tokens(run.target_tokens)} | {_num(per_update, 0)} "
            f"| {results.minutes(run.train_wall_s, digits=0)} | {_num(run.tokens_per_s, 0)} "
            f"| {_num(val.get('bleu_lc'))} | {_num(val.get('bleu_tok_lc'))} "
            f"| {_num(test.get('bleu_lc'))} | {_num(test.get('bleu_tok_lc'))} "
            f"| {run.hardware} | `{run.command}` |"
        )
    return lines


def scoring_references(split: str, lang: str = "de") -> list[str]:
    """The raw references of `split`, normalised as `prepare` and both systems' scoring do."""
    from benchmarks.fairseq import train_peer

    return train_peer.raw_references(train_peer.default_corpus(), split, lang)


def paired_groups(runs: list[Run]) -> list[tuple[str, int, list[Run], list[Run]]]:
    """(our recipe, budget, our runs, fairseq's runs) for each budget both ran with Wu et al.'s
    recipe: the recipe as it is first, then each earlier setting of it that rows were recorded
    under; the runs of each side in seed order, as many of each as there are seed pairs."""
    theirs = [r for r in runs if r.system.startswith("fairseq")]
    ours = [r for r in runs if r.system == "ours" and r.experiment == WU_RECIPE]
    recipes = sorted({r.recipe for r in ours}, key=lambda recipe: (recipe != WU_RECIPE, recipe))
    groups = []
    for recipe in recipes:
        budgets = {r.max_updates for r in ours if r.recipe == recipe}
        for budget in sorted(budgets & {r.max_updates for r in theirs}):
            mine = sorted((r for r in ours if (r.recipe, r.max_updates) == (recipe, budget)),
                          key=lambda r: r.seed)  # fmt: skip
            other = sorted((r for r in theirs if r.max_updates == budget), key=lambda r: r.seed)
            pairs = min(len(mine), len(other))
            groups.append((recipe, budget, mine[:pairs], other[:pairs]))
    return groups


def comparisons(runs: list[Run]) -> list[str]:
    """Ours minus fairseq for each budget both ran with Wu et al.'s recipe (`paired_groups`),
    each earlier setting of the recipe named."""
    lines = []
    shared = paired_groups(runs)
    references = {split: scoring_references(split) for split in SPLITS} if shared else {}
    for recipe, budget, mine, other in shared:
        pairs = len(mine)
        cells, lengths = [], []
        for split in SPLITS:
            delta = statistics.fmean(r.scores[split][P_METRIC] for r in mine) - (
                statistics.fmean(r.scores[split][P_METRIC] for r in other)
            )
            our_seeds = [run.translations(split) for run in mine]
            fairseq_seeds = [run.translations(split) for run in other]
            p = scoring.pooled_paired_bootstrap(
                list(zip(fairseq_seeds, our_seeds)), references[split], P_METRIC
            )
            cells.append(f"{split} {delta:+.2f} (p = {p:.3f})")
            lengths.append(
                f"{split} {_pooled_length_ratio(our_seeds, references[split]):.3f} / "
                f"{_pooled_length_ratio(fairseq_seeds, references[split]):.3f}"
            )
        named = "" if recipe == WU_RECIPE else f" (ours: {recipe})"
        lines.append(
            f"- {budget} updates{named}, {pairs} seed pair(s): ours - fairseq, lowercased "
            "BLEU: " + "; ".join(cells)
        )
        lines.append(
            "  - output length / reference length (the tokens of lowercased BLEU, what its "
            "brevity penalty sees), ours / fairseq: " + "; ".join(lengths)
        )
        lines.append(seed_level_line(mine, other))
    return lines


def seed_intervals(mine: list[Run], other: list[Run]) -> dict[str, tuple[float, float] | None]:
    """Per split, the INTERVAL_CONFIDENCE Welch t-interval of ours - fairseq over the seeds'
    lowercased BLEU (the unit is the training run), or None where Welch's test gives none (a
    single seed a side)."""
    intervals = {}
    for split in SPLITS:
        low, high = seed_stats.welch_interval(
            [r.scores[split][P_METRIC] for r in mine],
            [r.scores[split][P_METRIC] for r in other],
            INTERVAL_CONFIDENCE,
        )
        intervals[split] = None if low is None or high is None else (low, high)
    return intervals


def seed_level_line(mine: list[Run], other: list[Run]) -> str:
    """The seed-level interval of each split and whether it lies within the parity margin."""
    intervals = seed_intervals(mine, other)
    head = f"  - seed-level {INTERVAL_CONFIDENCE:.0%} interval of ours - fairseq (Welch's t"
    if any(interval is None for interval in intervals.values()):
        return f"{head}): none ({seed_stats.SINGLE_RUN})"
    shown = "; ".join(
        f"{split} [{low:.2f}, {high:.2f}]" for split, (low, high) in intervals.items()
    )
    inside = "; ".join(
        f"{split} {'yes' if -EQUIVALENCE_MARGIN < low and high < EQUIVALENCE_MARGIN else 'no'}"
        for split, (low, high) in intervals.items()
    )
    return (
        f"{head}, {len(mine)} seeds a side): {shown}; within +-{EQUIVALENCE_MARGIN} BLEU "
        f"(equivalence at the margin): {inside}"
    )


def _pooled_length_ratio(seeds: list[list[str]], references: list[str]) -> float:
    """`scoring.length_ratio` of several seeds' translations side by side."""
    return scoring.length_ratio([line for seed in seeds for line in seed], references * len(seeds))


def blocks(results_root: Path, parity_dir: Path) -> dict[tuple[Path, str], str]:
    """Each generated block by its page and name: the table, and the comparisons below it."""
    runs = all_runs(results_root, parity_dir)
    compared = comparisons(runs) or ["- no budget run by both systems yet"]
    return {
        (PAGE, BLOCK): "\n".join(table(runs)) + "\n",
        (COMPARISONS_PAGE, COMPARISONS_BLOCK): "\n".join(compared + decoding_lines(parity_dir))
        + "\n",
    }


def markdown(results_root: Path, parity_dir: Path) -> str:
    """Both blocks, the table first."""
    return "\n".join(blocks(results_root, parity_dir).values())


def all_runs(results_root: Path, parity_dir: Path) -> list[Run]:
    runs = fairseq_runs(parity_dir) + our_runs(results_root) + decoded_runs(parity_dir)
    runs.sort(key=lambda r: (r.experiment != WU_RECIPE, r.max_updates, r.system, r.recipe, r.seed))
    return runs


def drawn_runs(runs: list[Run]) -> list[Run]:
    """fairseq's runs and ours of Wu et al.'s preset as it is now (no earlier settings)."""
    return [r for r in runs if r.experiment == WU_RECIPE
            and (r.system != "ours" or r.recipe == WU_RECIPE)]  # fmt: skip


def figure(runs: list[Run], out: Path) -> Path:
    """Each seed of fairseq and of the preset as it is, per budget, on val and test2016."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = drawn_runs(runs)
    systems = sorted({r.system for r in shown}, key=lambda system: system == "ours")
    budgets = sorted({r.max_updates for r in shown})
    fig, axes = plt.subplots(1, len(SPLITS), figsize=(10, 4), sharey=True)
    for ax, split in zip(axes, SPLITS):
        for i, system in enumerate(systems):
            offset = (i - (len(systems) - 1) / 2) * 0.25
            for j, budget in enumerate(budgets):
                scores = [r.scores[split][P_METRIC] for r in shown
                          if (r.system, r.max_updates) == (system, budget)]  # fmt: skip
                if not scores:
                    continue
                x = j + offset
                ax.scatter([x] * len(scores), scores, color=f"C{i}", zorder=3,
                           label=system if j == 0 or budget == budgets[0] else None)  # fmt: skip
                ax.hlines(statistics.fmean(scores), x - 0.1, x + 0.1, color=f"C{i}")
        if split == results.TEST_SPLIT:
            ax.axhline(LITERATURE_TEST_BLEU, color="gray", linestyle="--",
                       label=f"Wu et al. 2021: {LITERATURE_TEST_BLEU}")  # fmt: skip
        ax.set_xticks(range(len(budgets)), [f"{b} updates allowed" for b in budgets])
        ax.set_xlim(-0.6, len(budgets) - 0.4)
        ax.set_title(split)
        ax.grid(alpha=0.3, axis="y")
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
    axes[0].set_ylabel("BLEU, lowercased (each dot a seed, bar the mean)")
    fig.suptitle(f"Wu et al.'s recipe: fairseq against ours ({WU_RECIPE} as it is)")
    fig.text(0.5, 0.01, "one seed's bootstrap 95% interval on either split: about +-1.6 BLEU",
             ha="center", fontsize=8)  # fmt: skip
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fairseq.parity", description=__doc__
    )
    parser.add_argument("--results", type=Path, default=results.RESULTS_ROOT)
    parser.add_argument("--parity-dir", type=Path, default=PARITY_DIR)
    docs_blocks.add_update_argument(parser, f"{PAGE} and {COMPARISONS_PAGE} (and draw {FIGURE})")
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    generated = blocks(args.results, args.parity_dir)
    if args.update_docs:
        for (page, name), block in generated.items():
            docs_blocks.fill(args.update_docs / page, name, block)
        figure(all_runs(args.results, args.parity_dir), args.parity_dir / FIGURE)
    print("\n".join(generated.values()), end="")


if __name__ == "__main__":
    main(cli)
