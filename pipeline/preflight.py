"""The `check` stage's library: refuse a bad configuration while the last good run is intact,
and record which raw corpus the pipeline reads.

DVC deletes a stage's outputs before it runs the stage's command, so a stage that refuses its
config at start-up has already cost the previous run's outputs. The check stage runs before
every other stage (the prepare stage depends on its record, every later stage on prepare) and
fails first: nothing downstream starts, nothing is deleted.

Its record holds the SHA-256 of every raw corpus file the prepare stage will read (a file only
`data.url` has is fetched into the cache here, so a failed download fails first too), not where
the files are: another copy of the same corpus changes nothing, a changed corpus (another
`data.raw_dir` or `MULTI30K_DIR`, a file replaced in place) changes the record, and DVC runs
prepare again. A file whose decompressed text or a line of it is past `data.limits` (a gzip
bomb) is refused here, read in blocks, before prepare would spend the memory.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.config_schema import Config, DataConfig
from pipeline.data.corpus import check_size, corpus_splits
from pipeline.data.download import sha256_of
from pipeline.data.sources import DEFAULT_CACHE_DIR, locate_multi30k, text_file_paths
from pipeline.errors import ConfigError


def _checked(path: Path, data: DataConfig) -> str:
    """The file's SHA-256, once its decompressed size and lines are within `data.limits`."""
    check_size(path, data.limits)
    return sha256_of(path)


def _multi30k_files(data: DataConfig, splits: list[str], cache_dir: Path) -> dict[str, str]:
    paths = locate_multi30k(data, splits, cache_dir)  # a download, if any, happens here
    return {f"{split}.{lang}": _checked(path, data) for (split, lang), path in paths.items()}


def _text_files(data: DataConfig, splits: list[str]) -> dict[str, str]:
    paths = text_file_paths(data, splits)
    return {f"{s}.{side}": _checked(path, data) for s in splits
            for side, path in paths[s].items()}  # fmt: skip


def corpus_record(data: DataConfig, cache_dir: Path | None = None) -> dict:
    """What identifies the raw corpus the prepare stage reads; raises what prepare would raise
    for an impossible split list or a file that is missing (locally and from data.url)."""
    splits = corpus_splits(data)
    if data.source == "multi30k":
        files = _multi30k_files(data, splits, cache_dir or DEFAULT_CACHE_DIR)
    elif data.source == "text":
        files = _text_files(data, splits)
    else:
        if not data.hf_path:
            raise ConfigError(
                "config key 'data.hf_path': source=hf needs a dataset name or folder",
                key="data.hf_path",
            )
        files = {"hf": f"{data.hf_path} {data.hf_name or ''}".strip()}
    return {"source": data.source, "src_lang": data.src_lang, "tgt_lang": data.tgt_lang,
            "files": files}  # fmt: skip


def check(cfg: Config, cache_dir: Path | None = None) -> dict:
    """Everything a later stage would refuse at its start, checked now; the corpus record."""
    if cfg.eval.checkpoint and not Path(cfg.eval.checkpoint).is_file():
        raise ConfigError(
            f"config key 'eval.checkpoint': {cfg.eval.checkpoint} is not a file; point it at a "
            f"checkpoint (under {Path(cfg.paths.train_dir) / 'checkpoints'}) or set it to null",
            key="eval.checkpoint",
        )
    return corpus_record(cfg.data, cache_dir)


def averaging_note(cfg: Config) -> str | None:
    """A note where the evaluate stage would average fewer checkpoints than `eval.average`:
    a run saves one at each validation (and its last step validates), so shortening
    `train.max_steps` under the recipe's averaging changes what is evaluated. None where it
    averages as many, or where the count is not known before training (an epoch budget)."""
    t, e = cfg.train, cfg.eval
    if e.checkpoint or t.max_steps < 0:
        return None
    saved = math.ceil(t.max_steps / t.val_check_interval)
    if saved >= e.average:
        return None
    return (
        f"note: eval.average={e.average}, but this run saves {saved} step checkpoint(s) "
        f"(train.max_steps={t.max_steps}, a validation every train.val_check_interval="
        f"{t.val_check_interval} steps and at the last): the evaluate stage will average "
        f"{saved}. Lower eval.average or train.val_check_interval to average as many as asked."
    )
