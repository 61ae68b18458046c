"""The prepared corpus (`paths.prepared`): the `prepare` stage reads every split from its source,
validates and cleans it and writes the folder and `metrics/prepare.json`; later stages read it
back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.atomic import atomic_directory, write_json_atomic
from pipeline.config_schema import Config
from pipeline.data.corpus import ParallelText, clean_split, corpus_splits, read_pair, write_lines
from pipeline.data.sources import read_corpus
from pipeline.errors import DataError


def prepared_path(cfg: Config, split: str, lang: str) -> Path:
    """`cfg.paths.prepared/{split}.{lang}`: what `prepare` writes and `tokenize` reads."""
    return Path(cfg.paths.prepared) / f"{split}.{lang}"


def prepare(cfg: Config, cache_dir: Path | None = None) -> dict:
    """Read, validate, clean every split; write `paths.prepared` and `metrics/prepare.json`.

    Everything is read and checked before anything is written, and the prepared folder is
    replaced atomically, so a bad input leaves the previous output as it was.
    Returns the stats written to prepare.json.
    """
    data = cfg.data
    raw = read_corpus(data, cache_dir)
    cleaned, split_stats = {}, {}
    for split, pair in raw.items():
        cleaned[split], split_stats[split] = clean_split(pair, data)
    keep = {**cfg.paths.outputs("prepared"), "data.raw_dir": data.raw_dir}
    with atomic_directory(cfg.paths.prepared, keep) as staging:
        for split, pair in cleaned.items():
            write_lines(staging / f"{split}.{data.src_lang}", pair.src)
            write_lines(staging / f"{split}.{data.tgt_lang}", pair.tgt)
    stats = {
        "source": data.source,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "splits": split_stats,
    }
    write_json_atomic(Path(cfg.paths.metrics_dir) / "prepare.json", stats)
    return stats


def read_prepared(
    cfg: Config,
    splits: Sequence[str] | None = None,
    missing_hint: str = "run `dvc repro prepare` (or `python -m pipeline.stages.prepare`) first",
) -> dict[str, ParallelText]:
    """Prepared splits (all of the corpus's by default), every file checked before any is read;
    a missing one raises DataError naming the files, with `missing_hint` for the fix."""
    result = {}
    for split in corpus_splits(cfg.data) if splits is None else splits:
        paths = [prepared_path(cfg, split, lang) for lang in (cfg.data.src_lang, cfg.data.tgt_lang)]
        absent = [str(p) for p in paths if not p.is_file()]
        if absent:
            raise DataError(f"'{split}' has no prepared text ({', '.join(absent)}): {missing_hint}")
        result[split] = read_pair(split, *paths)
    return result
