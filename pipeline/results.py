"""The results table (docs/results-runs.md) and README's headline table, built from the runs' own
metrics files (never typed by hand).

A row is a folder `results/<name>/` holding what one full `dvc repro` wrote: the stages' DVC
metrics (`prepare.json`, `tokenize.json`, `train.json`, `eval.json`), the `params.yaml` it ran
with, and `run.json` (the command, the machine, the commit; `reproduce`, where the command that
ran is not the one a user types, is that command). After a run:

    python -m pipeline.results record multi30k_tiny.en-de --command "make repro"
    python -m pipeline.results table --update-docs  # docs/results-runs.md and README.md, rewritten

README shows the rows that `results/headline.txt` names, in its order, with fewer columns; each
must have its hypotheses committed (`val.hyp`, `test_2016_flickr.hyp`), so that every number on
the front page can be rescored. The full table marks the rows without them.
`tests/test_results.py` checks that both blocks are exactly `table` of the committed rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import yaml

from pipeline import docs_blocks
from pipeline.atomic import write_json_atomic
from pipeline.cli import main
from pipeline.environment import provenance
from pipeline.errors import DataError
from pipeline.evaluation.scoring import LITERATURE_METRIC
from pipeline.metric_names import FORMER_SUMMARY, current_names
from pipeline.portable_paths import copy_relativized
from pipeline.redaction import hide_passwords
from pipeline.sweep.spec import WORK_ROOT

RESULTS_ROOT = Path("results")
METRICS_FILES = ("prepare.json", "tokenize.json", "train.json", "eval.json")
RUN_FILE = "run.json"
BLOCK, HEADLINE_BLOCK = "results", "results:headline"  # TABLE_PAGE's, README.md's
PAGE = docs_blocks.DOCS / "results.md"  # what the recipe and its variants showed
TABLE_PAGE = docs_blocks.DOCS / "results-runs.md"  # every recorded run (generated)
HEADLINE_FILE = "headline.txt"  # in the results folder: the rows README shows, one name a line
HEADLINE_COLUMNS = ["recipe", "direction", "test2016 BLEU (lc)", "val BLEU (lc)",
                    "train + eval wall time", "hardware", "command"]  # fmt: skip
TEST_SPLIT = "test_2016_flickr"
VAL_SPLIT = "val"
# A row can be rescored (by sacreBLEU, a paired bootstrap against another row) only with the
# translations it was scored on; README's headline shows no row without them
HYPOTHESES = tuple(f"{split}.hyp" for split in (VAL_SPLIT, TEST_SPLIT))
NOT_RESCORABLE = "not rescorable (no hypotheses committed)"


def record(
    name: str,
    command: str,
    metrics_dir: Path,
    params: Path,
    root: Path,
    eval_dir: Path | None = None,
    made_on: Path | None = None,
) -> Path:
    """Copy a finished run's metrics and params into `root/name/` and describe the run; with
    `eval_dir`, its hypotheses too (`{split}.hyp`), so that two rows can be compared later
    sentence by sentence (a paired bootstrap) instead of by their scores alone. A run made on
    another machine names that machine with `made_on`: the JSON that `python -m
    pipeline.environment` printed there (commit, hardware, environment), kept in place of
    this machine's."""
    missing = [f for f in METRICS_FILES if not (metrics_dir / f).exists()]
    if missing:
        raise DataError(
            f"{metrics_dir}: no {', '.join(missing)}; run the whole pipeline first (dvc repro)"
        )
    row = root / name
    row.mkdir(parents=True, exist_ok=True)
    for file in (*METRICS_FILES, "params.yaml"):  # paths relative: no machine's home in a row
        source = params if file == "params.yaml" else metrics_dir / file
        copy_relativized(source, row / file, Path.cwd(), WORK_ROOT)
    if eval_dir is not None:
        for hypotheses in sorted(eval_dir.glob("*.hyp")):
            shutil.copyfile(hypotheses, row / hypotheses.name)
    run = {
        "command": hide_passwords(command),  # a storage URL in it keeps its password out
        **(json.loads(made_on.read_text()) if made_on is not None else provenance()),
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        **run_totals(metrics_dir),
    }
    write_json_atomic(row / RUN_FILE, run)
    return row


def run_totals(metrics_dir: Path) -> dict:
    """The target tokens the run trained on: train.json's own figure, else (runs trained before
    it was recorded there) its last checkpoint's run totals, read where train.json says the
    checkpoints are (relative to the workspace that holds `metrics_dir`)."""
    train = json.loads((metrics_dir / "train.json").read_text())
    if train.get("train/target_tokens") is not None:
        return {"target_tokens": int(train["train/target_tokens"])}
    if not train.get("checkpoint_dir"):
        return {}
    from pipeline.training.checkpoints import LAST_NAME, read_checkpoint
    from pipeline.training.throughput import TOTALS_KEY

    last = metrics_dir.resolve().parent / train["checkpoint_dir"] / LAST_NAME
    if not last.exists():
        return {}
    totals = read_checkpoint(last).get(TOTALS_KEY, {})
    return {"target_tokens": int(totals["train_tokens"])} if "train_tokens" in totals else {}


def load_rows(root: Path) -> list[dict]:
    """Every recorded row under `root`, sorted by name; `rescorable` says whether its
    hypotheses are committed beside it."""
    rows = []
    for row in sorted(p for p in root.glob("*") if (p / RUN_FILE).exists()):
        files = {f: json.loads((row / f).read_text()) for f in (*METRICS_FILES, RUN_FILE)}
        files["train.json"] = current_names(files["train.json"], FORMER_SUMMARY)
        params = yaml.safe_load((row / "params.yaml").read_text())
        rescorable = all((row / hypotheses).exists() for hypotheses in HYPOTHESES)
        rows.append({"name": row.name, "params": params, "rescorable": rescorable, **files})
    return rows


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _with_interval(value: float | None, half_width: float | None) -> str:
    """'39.1 ± 1.6' where the run measured a 95% bootstrap half-width, else the value alone."""
    return _fmt(value) if half_width is None else f"{_fmt(value)} ± {_fmt(half_width)}"


def minutes(seconds: float | None, digits: int = 1) -> str:
    """A wall time in a table cell: `12.3 min`, or "-" where it was not measured."""
    return "-" if seconds is None else f"{seconds / 60:.{digits}f} min"


def reproduce_command(run: dict) -> str:
    """The command that makes the row again: the one a user types where the run was started
    otherwise (`reproduce`), else the command that ran. Both run at the row's commit."""
    return run.get("reproduce", run["command"])


def table(rows: list[dict]) -> str:
    """The Markdown block docs/results-runs.md carries between its results markers."""
    header = (
        "| recipe | direction | averaged, length penalty | test2016 BLEU (lc) "
        "| test2016 BLEU (cased) | test2016 tokenized BLEU (lc) | chrF | val BLEU (lc) "
        "| parameters | train + eval wall time | hardware | command | hypotheses |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    signatures: dict[str, str] = {}
    for row in rows:
        train, evaluation, run = row["train.json"], row["eval.json"], row[RUN_FILE]
        test, val = evaluation.get(TEST_SPLIT, {}), evaluation.get(VAL_SPLIT, {})
        data, decoding = row["params"]["data"], row["params"]["eval"]
        train_s, eval_s = train.get("wall_time_s"), evaluation.get("wall_time_s")
        wall = f"{minutes(train_s)} + {minutes(eval_s)}"  # "-" where a run has no time
        recipe = row["params"]["experiment_name"]
        penalty = f"{decoding['length_penalty']}"
        if decoding.get("length_normalization", "gnmt") != "gnmt":  # rows before the key: gnmt
            penalty += f" ({decoding['length_normalization']})"
        if data.get("tokenizer", {}).get("case_fold"):
            recipe += ", case-folded"  # reads and writes lowercase: its cased scores count that
        lines.append(
            f"| {recipe} | {data['src_lang']}->{data['tgt_lang']} "
            f"| {decoding['average_by']} {decoding['average']}, {penalty} "
            f"| {_with_interval(test.get('bleu_lc'), test.get('bleu_lc_ci'))} "
            f"| {_fmt(test.get('bleu'))} "
            f"| {_fmt(test.get(LITERATURE_METRIC))} | {_fmt(test.get('chrf'))} "
            f"| {_fmt(val.get('bleu_lc'))} | {train['num_parameters'] / 1e6:.2f} M | {wall} "
            f"| {run['hardware']}, {train['precision']} | `{reproduce_command(run)}` "
            f"| {'committed' if row['rescorable'] else NOT_RESCORABLE} |"
        )
        signatures.update(evaluation.get("signatures", {}))
    lines.append("")
    lines += [f"- `{metric}`: `{sig}`" for metric, sig in sorted(signatures.items())]
    return "\n".join(lines) + "\n"


def headline(rows: list[dict], root: Path) -> str:
    """README's short table: the rows `root/headline.txt` names, in its order, each with its
    hypotheses committed."""
    listing = root / HEADLINE_FILE
    if not listing.exists():
        raise DataError(f"{listing}: no such file (the names of README's rows, one a line)")
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    by_name = {row["name"]: row for row in rows}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise DataError(f"{listing}: no recorded row {', '.join(unknown)} under {root}")
    bare = [name for name in names if not by_name[name]["rescorable"]]
    if bare:
        raise DataError(
            f"{listing}: {', '.join(bare)} under {root} has no {' or '.join(HYPOTHESES)}: "
            "README shows only rows that can be rescored"
        )
    return docs_blocks.columns(table([by_name[name] for name in names]), HEADLINE_COLUMNS)


def update_docs(rows: list[dict], root: Path, docs_root: Path) -> None:
    """Write the table into docs/results-runs.md and the headline into README.md under
    `docs_root`."""
    docs_blocks.fill(docs_root / TABLE_PAGE, BLOCK, table(rows))
    docs_blocks.fill(docs_root / docs_blocks.README, HEADLINE_BLOCK, headline(rows, root))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Raw: the docstring's example commands keep their lines (argparse would run them together)
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.results",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=RESULTS_ROOT,
        help=f"the recorded rows (default: {RESULTS_ROOT})",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="copy the finished run's metrics into results/<name>/")
    rec.add_argument("name", help="e.g. multi30k_tiny.en-de")
    rec.add_argument("--command", required=True, help="the command that produced the run")
    rec.add_argument(
        "--metrics-dir",
        type=Path,
        default=Path("metrics"),
        help="the run's stage metrics (prepare, tokenize, train and eval .json; default: metrics)",
    )
    rec.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="the run's config (default: params.yaml)",
    )
    rec.add_argument(
        "--eval-dir", type=Path, default=Path("eval"), help="the run's hypotheses ({split}.hyp)"
    )
    rec.add_argument(
        "--made-on",
        type=Path,
        help="a run made on another machine: the JSON `python -m pipeline.environment` printed "
        "there (commit, hardware, environment) in place of this machine's",
    )
    tab = sub.add_parser("table", help="print the results table")
    docs_blocks.add_update_argument(tab, f"{PAGE} (and the headline into README.md)")
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.action == "record":
        row = record(
            args.name,
            args.command,
            args.metrics_dir,
            args.params,
            args.root,
            args.eval_dir,
            args.made_on,
        )
        print(f"recorded {row}")
    else:
        rows = load_rows(args.root)
        if args.update_docs:
            update_docs(rows, args.root, args.update_docs)
        print(table(rows), end="")


if __name__ == "__main__":
    main(cli)
