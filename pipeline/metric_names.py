"""One name for each number a run reports, the same on the console, in DVC's metrics, in W&B,
in Optuna and in the reports.

Three numbers used to share a name with another: training's greedy validation BLEU and the
evaluate stage's beam-search BLEU of the val split were both "val BLEU"; the tokens per second
of one logging window (the progress bar, the W&B curve) and of the whole run (`train.json`)
were both `train/tokens_per_sec`. Records written under the former names stay readable:
`current_names` renames their keys on reading.
"""

from __future__ import annotations

from typing import Any

# Training's validation: greedy decoding of the val split, sacreBLEU's cased corpus BLEU. It
# ranks checkpoints and is a sweep's objective; the evaluate stage's beam-search scores of the
# same split are `eval/val/bleu` and `eval/val/bleu_lc`.
GREEDY_VAL_BLEU = "val/greedy_bleu"
# What a run's training returns of its validations (best and last, `train.json`): what a sweep
# may optimise. val/greedy_bleu only where train.val_bleu decodes it.
VAL_METRICS = (GREEDY_VAL_BLEU, "val/loss", "val/nll_loss", "val/ppl")
# Target tokens per second of training over one logging window (the bar's `tok/s`, W&B's curve)
# and over the whole run, validation excluded and across resumes (`train.json`, W&B's summary).
WINDOW_TOKENS_PER_SEC = "train/tokens_per_sec"
MEAN_TOKENS_PER_SEC = "train/mean_tokens_per_sec"

# Former names, by where they were written: a run's logged values (checkpoint histories, curves,
# DVCLive) and a run's summary (`train.json`, a trial's record), where the tokens per second
# were the whole run's.
FORMER_LOGGED = {"val/bleu": GREEDY_VAL_BLEU}
FORMER_SUMMARY = {**FORMER_LOGGED, WINDOW_TOKENS_PER_SEC: MEAN_TOKENS_PER_SEC}


def current_names(values: dict[str, Any], former: dict[str, str] = FORMER_LOGGED) -> dict:
    """`values` with keys of a former name under today's (a copy; nested dicts too). A key
    already under today's name wins over a former one."""
    renamed = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = current_names(value, former)
        new = former.get(key, key)
        if new != key and new in values:
            continue
        renamed[new] = value
    return renamed


def current_metric(name: str) -> str:
    """A metric's name today (a sweep spec's objective written under a former name)."""
    return FORMER_LOGGED.get(name, name)
