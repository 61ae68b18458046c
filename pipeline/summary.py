"""The numbers people compare across experiments: the one file DVC declares as metrics.

`dvc exp show` and `dvc metrics show/diff` read `metrics/summary.json`, named as W&B names
them: `test/{bleu_lc,chrf,ter}` for the benchmark split (the first test split),
`eval/<split>/...` for every other evaluated split, training's `val/loss` and `val/ppl`, its
updates, wall time and throughput. BLEU here is the headline's BLEU (lc), sacreBLEU's
lowercased BLEU, under the name W&B and the reports give it (`bleu_lc`); cased BLEU stays in
`eval.json` and W&B as `bleu`. The stages' full records (`prepare.json`, `tokenize.json`,
`train.json`, `eval.json` beside it: corpus statistics, signatures, intervals) stay plain
outputs.

A run ends with its test BLEU, where the eye lands: the summarize stage prints `headline`
last, and `python -m pipeline.summary` prints it again from the file (`make repro` and `make
smoke` do, after DVC's own lines and also when DVC had nothing to run):

    test BLEU (lc) 35.1 on test_2016_flickr (chrF 61.2, TER 47.9); val 36.0

(in 80 columns; the numbers are `metrics/summary.json`'s).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.cli import main, parser
from pipeline.config_schema import Config
from pipeline.errors import DataError
from pipeline.metric_names import FORMER_SUMMARY, MEAN_TOKENS_PER_SEC, current_names

SUMMARY_FILE = "summary.json"  # in paths.metrics_dir
SCORES = ("bleu_lc", "chrf", "ter")  # per evaluated split, from eval.json
TRAINING = {  # summary key: train.json key
    "val/loss": "val/loss",
    "val/ppl": "val/ppl",
    "train/steps": "steps",
    "train/wall_time_s": "wall_time_s",
    MEAN_TOKENS_PER_SEC: MEAN_TOKENS_PER_SEC,
}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: cannot be read ({err}); run `dvc repro` first") from None


def summarize(cfg: Config) -> dict:
    """The summary of the train and evaluate stages' records in `paths.metrics_dir`."""
    metrics_dir = Path(cfg.paths.metrics_dir)
    scores = _read(metrics_dir / "eval.json")
    training = current_names(_read(metrics_dir / "train.json"), FORMER_SUMMARY)
    benchmark = cfg.data.test_splits[0] if cfg.data.test_splits else None
    summary = {}
    for split in cfg.eval.splits:
        prefix = "test" if split == benchmark else f"eval/{split}"
        summary.update({f"{prefix}/{key}": scores[split][key] for key in SCORES})
    summary.update(
        {key: training[source] for key, source in TRAINING.items() if source in training}
    )
    return summary


def headline(summary: dict, cfg: Config) -> str:
    """One line of 80 columns: the benchmark split's BLEU first, its chrF and TER, then the
    val split's BLEU of the same kind (beam search, averaged checkpoints; not training's
    `val/greedy_bleu`)."""
    path = Path(cfg.paths.metrics_dir) / SUMMARY_FILE
    # a summary written before BLEU (lc) was its headline holds the cased `bleu`
    name, label = ("bleu_lc", "BLEU (lc)") if "test/bleu_lc" in summary else ("bleu", "BLEU")
    if f"test/{name}" not in summary:
        return f"no test split scored (data.test_splits is empty): {path}"
    val = summary.get(f"eval/val/{name}")
    tail = f"; val {val:.1f}" if val is not None else ""
    return (
        f"test {label} {summary[f'test/{name}']:.1f} on {cfg.data.test_splits[0]} (chrF "
        f"{summary['test/chrf']:.1f}, TER {summary['test/ter']:.1f}){tail}"
    )


def show(argv: list[str] | None = None) -> str:
    """The last run's test BLEU, from metrics/summary.json (see `headline`)."""
    from pipeline import config as config_lib

    parser("pipeline.summary", show.__doc__).parse_args(argv)
    cfg = config_lib.load()
    line = headline(_read(Path(cfg.paths.metrics_dir) / SUMMARY_FILE), cfg)
    print(line, flush=True)
    return line


if __name__ == "__main__":
    main(show)
