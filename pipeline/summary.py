"""The numbers people compare across experiments: the one file DVC declares as metrics.

`dvc exp show` and `dvc metrics show/diff` read `metrics/summary.json`, named as W&B names
them: `test/{bleu_lc,chrf,ter}` for the benchmark split (the first test split),
`eval/<split>/...` for every other evaluated split, training's `val/loss` and `val/ppl`, its
updates, wall time and throughput. BLEU here is the headline's BLEU (lc), sacreBLEU's
lowercased BLEU, under the name W&B and the reports give it (`bleu_lc`); cased BLEU stays in
`eval.json` and W&B as `bleu`. The stages' full records (`prepare.json`, `tokenize.json`,
`train.json`, `eval.json` beside it: corpus statistics, signatures, intervals) stay plain
outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config_schema import Config
from pipeline.errors import DataError

SUMMARY_FILE = "summary.json"  # in paths.metrics_dir
SCORES = ("bleu_lc", "chrf", "ter")  # per evaluated split, from eval.json
TRAINING = {  # summary key: train.json key
    "val/loss": "val/loss",
    "val/ppl": "val/ppl",
    "train/steps": "steps",
    "train/wall_time_s": "wall_time_s",
    "train/tokens_per_sec": "train/tokens_per_sec",
}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: cannot be read ({err}); run `dvc repro` first") from None


def summarize(cfg: Config) -> dict:
    """The summary of the train and evaluate stages' records in `paths.metrics_dir`."""
    metrics_dir = Path(cfg.paths.metrics_dir)
    scores, training = _read(metrics_dir / "eval.json"), _read(metrics_dir / "train.json")
    benchmark = cfg.data.test_splits[0] if cfg.data.test_splits else None
    summary = {}
    for split in cfg.eval.splits:
        prefix = "test" if split == benchmark else f"eval/{split}"
        summary.update({f"{prefix}/{key}": scores[split][key] for key in SCORES})
    summary.update(
        {key: training[source] for key, source in TRAINING.items() if source in training}
    )
    return summary
