"""What fits the model's position table (`model.max_positions`): the encoder reads a source's
ids, the decoder a target's plus bos/eos. A sentence too long is refused before compute is
spent, naming the split, the line and the fix, never cut short in silence (a cut test source
would be scored as if the model had read it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pipeline.config_schema import Config
from pipeline.data.batching import TARGET_SPECIALS
from pipeline.data.prepared import prepared_path
from pipeline.errors import ConfigError

SOURCE, TARGET = "source", "target"


class Longest(NamedTuple):
    positions: int
    split: str
    index: int  # the example's row in its split
    side: str  # SOURCE or TARGET


def longest(sides: Iterable[tuple[str, str, Sequence[Sequence[int]]]]) -> Longest | None:
    """The example that needs the most positions over `(split, side, id sequences)`; the
    first of equals."""
    worst = None
    for split, side, sequences in sides:
        extra = TARGET_SPECIALS if side == TARGET else 0
        for index, ids in enumerate(sequences):
            if worst is None or len(ids) + extra > worst.positions:
                worst = Longest(len(ids) + extra, split, index, side)
    return worst


def check_fits(cfg: Config, limit: int, worst: Longest | None) -> None:
    """ConfigError naming the example (its line, where the corpus file has one per row) when
    it needs more than `limit` positions."""
    if worst is None or worst.positions <= limit:
        return
    positions, name, index, side = worst
    plus = " (its tokens + bos/eos)" if side == TARGET else ""
    applied = cfg.data.filter.apply_to
    if name in applied:
        shorten = f"drop long pairs of '{name}' (data.filter.max_words)"
    else:
        where = ""
        if name != cfg.data.train_split:  # tokenize drops no row: row = line
            lang = cfg.data.src_lang if side == SOURCE else cfg.data.tgt_lang
            where = f" (line {index + 1} of {prepared_path(cfg, name, lang)})"
        shorten = f"shorten or remove that pair{where} in the '{name}' corpus files"
        if name in cfg.data.test_splits:  # filtered, it would no longer be the benchmark
            shorten += " (a test split is scored whole: it is never filtered)"
        else:
            shorten += (
                f", or add '{name}' to data.filter.apply_to (now {list(applied)}) to filter it "
                "by data.filter.max_words"
            )
    raise ConfigError(
        f"config key 'model.max_positions'={limit} is shorter than the data: split "
        f"'{name}' example {index} has a {side} of {positions} positions{plus}. Raise "
        f"model.max_positions to at least {positions}, or {shorten}, and re-run "
        "`dvc repro tokenize`"
    )
