"""The `check` stage's library: refuse a bad configuration while the last good run is intact,
and record which raw corpus the pipeline reads.

DVC deletes a stage's outputs before it runs the stage's command, so a stage that refuses its
config at start-up has already cost the previous run's outputs. The check stage runs before
every other stage (the prepare stage depends on its record, every later stage on prepare) and
fails first: nothing downstream starts, nothing is deleted.

Its record holds the SHA-256 of every raw corpus file the prepare stage will read (or the
checksum a download is verified against), not where the files are: another copy of the same
corpus changes nothing, a changed corpus (another `data.raw_dir` or `MULTI30K_DIR`, a file
replaced in place) changes the record, and DVC runs prepare again.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config, DataConfig
from pipeline.data.corpus import corpus_splits, missing_files_error, sha256_of, text_file_paths
from pipeline.errors import ConfigError


def _multi30k_files(data: DataConfig, splits: list[str]) -> dict[str, str]:
    """{split.lang: SHA-256} of the local copy; a file only a download provides: the checksum
    the download is verified against (or its URL where data.sha256 has none)."""
    record, missing = {}, []
    raw_dir = Path(data.raw_dir)
    for split in splits:
        for lang in (data.src_lang, data.tgt_lang):
            local = [raw_dir / f"{split}.{lang}.gz", raw_dir / f"{split}.{lang}"]
            found = next((path for path in local if path.is_file()), None)
            name = f"{split}.{lang}.gz"
            if found is not None:
                record[f"{split}.{lang}"] = sha256_of(found)
            elif data.download and data.url:
                url = f"{data.url.rstrip('/')}/{name}"
                record[f"{split}.{lang}"] = data.sha256.get(name) or f"download {url}"
            else:
                missing.append(f"{split}.{lang}")
    if missing:
        raise missing_files_error(data, missing)
    return record


def _text_files(data: DataConfig, splits: list[str]) -> dict[str, str]:
    paths = text_file_paths(data, splits)
    return {f"{s}.{side}": sha256_of(path) for s in splits for side, path in paths[s].items()}


def corpus_record(data: DataConfig) -> dict:
    """What identifies the raw corpus the prepare stage reads (raises what prepare would
    raise for a missing file or an impossible split list, without reading or fetching)."""
    splits = corpus_splits(data)
    if data.source == "multi30k":
        files = _multi30k_files(data, splits)
    elif data.source == "text":
        files = _text_files(data, splits)
    else:
        if not data.hf_path:
            raise ConfigError("config key 'data.hf_path': source=hf needs a dataset name or folder")
        files = {"hf": f"{data.hf_path} {data.hf_name or ''}".strip()}
    return {"source": data.source, "src_lang": data.src_lang, "tgt_lang": data.tgt_lang,
            "files": files}  # fmt: skip


def check(cfg: Config) -> dict:
    """Everything a later stage would refuse at its start, checked now; the corpus record."""
    if cfg.eval.checkpoint and not Path(cfg.eval.checkpoint).is_file():
        raise ConfigError(
            f"config key 'eval.checkpoint': {cfg.eval.checkpoint} is not a file; point it at a "
            f"checkpoint (under {Path(cfg.paths.train_dir) / 'checkpoints'}) or set it to null"
        )
    return corpus_record(cfg.data)
