"""The `tokenize` stage: the joint subword model trained on the prepared training split (source +
target lines, never val/test), every split encoded, and the result saved atomically as Arrow
splits of token ids with a manifest of every file's size and SHA-256 (`load_tokenized` checks
it before any training reads them).

sentencepiece trains on sentences of at most SPM_MAX_SENTENCE_BYTES UTF-8 bytes (as it reads
them: after pre-tokenization) and would skip a longer one without a word at our log level. A
training pair with such a sentence is dropped instead, as `data.filter` drops one (the subword
model and the Transformer see the same pairs), with a warning naming the file and line, and
counted in tokenize.json (the train split's `dropped`); a training split with nothing left is a
DataError naming the first such line.
Encoding has no such limit: val and test sentences are never dropped, whatever their length.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from pipeline import console
from pipeline.atomic import atomic_directory, write_json_atomic
from pipeline.config_schema import Config
from pipeline.data.corpus import ParallelText
from pipeline.data.download import sha256_of
from pipeline.data.prepared import read_prepared
from pipeline.data.subword_nmt import SubwordNmt
from pipeline.data.tokenizer import (
    MODEL_FILE,
    REPRO_HINT,
    SUBWORD_NMT,
    Pretokenizer,
    Tokenizer,
    train_tokenizer,
)
from pipeline.errors import DataError

SPLITS_DIR = "splits"
MANIFEST_FILE = "manifest.json"  # sizes + SHA-256 of every saved file, checked on load
COLUMNS = ("src_ids", "tgt_ids", "src_len", "tgt_len", "src_text", "tgt_text")
ENCODE_CHUNK = 2048  # sentences per progress-bar step
# sentencepiece's own limit on a training sentence, in UTF-8 bytes: TrainerSpec's
# max_sentence_length default, which the trainer is left at (setting it, even to this value,
# changes spm.model's bytes and so every DVC hash downstream).
SPM_MAX_SENTENCE_BYTES = 4192
OVER_SPM_LIMIT = "over_sentencepiece_max_bytes"  # the reason, in tokenize.json's `dropped`
SHOWN_LINES = 5  # over-long lines a warning lists by file and line


def spm_trainable(
    train: ParallelText, pretokenizer: Pretokenizer | None = None
) -> tuple[ParallelText, list[str], list[str]]:
    """The training pairs that sentencepiece can train on (both sentences at most
    SPM_MAX_SENTENCE_BYTES UTF-8 bytes as it reads them, after `pretokenizer`: its limit),
    the text it trains on (their sources, then their targets, pre-tokenized), and
    `file:line: N bytes` for the longer over-long sentence of each pair left out (lines of
    the prepared files, from 1).

    A split in which no pair is left is a DataError naming the first over-long line.
    """
    pretokenizer = pretokenizer if pretokenizer is not None else Pretokenizer()  # none: as it is
    read_src, read_tgt = pretokenizer.sources(train.src), pretokenizer.targets(train.tgt)
    kept, over = [], []
    for index, pair in enumerate(zip(read_src, read_tgt)):
        sizes = [len(text.encode("utf-8")) for text in pair]
        if max(sizes) <= SPM_MAX_SENTENCE_BYTES:
            kept.append(index)
            continue
        origin = train.src_origin if sizes[0] >= sizes[1] else train.tgt_origin
        over.append(f"{origin}:{index + 1}: {max(sizes)} bytes")
    if not kept:
        raise DataError(
            f"{over[0]}, over sentencepiece's limit of {SPM_MAX_SENTENCE_BYTES} UTF-8 bytes for "
            f"a training sentence, and every one of the {len(over)} training pairs has a "
            "sentence that long: no text is left to train the subword model on. A corpus "
            "file must hold one sentence per line: fix the training files, then `dvc repro`"
        )
    pairs = ParallelText(
        train.split,
        [train.src[i] for i in kept],
        [train.tgt[i] for i in kept],
        train.src_origin,
        train.tgt_origin,
    )
    return pairs, [read_src[i] for i in kept] + [read_tgt[i] for i in kept], over


def encode_split(tokenizer: Tokenizer, pair: ParallelText) -> dict[str, list]:
    """Columns of one split (see COLUMNS), encoded in chunks with a progress bar."""
    src_ids: list[list[int]] = []
    tgt_ids: list[list[int]] = []
    with console.Phase(f"encode {pair.split}", total=len(pair.src), unit="sent") as bar:
        for start in range(0, len(pair.src), ENCODE_CHUNK):
            src_ids += tokenizer.encode_sources(pair.src[start : start + ENCODE_CHUNK])
            tgt_ids += tokenizer.encode_targets(pair.tgt[start : start + ENCODE_CHUNK])
            bar.update(min(ENCODE_CHUNK, len(pair.src) - start))
    return {
        "src_ids": src_ids,
        "tgt_ids": tgt_ids,
        "src_len": [len(ids) for ids in src_ids],
        "tgt_len": [len(ids) for ids in tgt_ids],
        "src_text": pair.src,
        "tgt_text": pair.tgt,
    }


def _file_manifest(root: Path) -> dict[str, dict]:
    return {
        str(path.relative_to(root)): {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def tokenize(cfg: Config) -> dict:
    """The `tokenize` stage: train the joint model, encode every split, save atomically.

    Writes `paths.tokenized/{spm.model, spm.vocab, [spm.pretokenizer.json,] [spm.bpe-codes,
    spm.bpe-vocab.src, spm.bpe-vocab.tgt,] splits/ (DatasetDict), manifest.json}` and
    `metrics/tokenize.json`; returns the metrics.
    """
    import datasets

    data = cfg.data
    corpus = read_prepared(cfg)
    pretokenizer = Pretokenizer.from_config(data)
    train, train_text, over = spm_trainable(corpus[data.train_split], pretokenizer)
    if over:
        more = f", and {len(over) - SHOWN_LINES} more" if len(over) > SHOWN_LINES else ""
        warnings.warn(
            f"{len(over)} of {len(corpus[data.train_split].src)} training pairs dropped: a "
            f"sentence over sentencepiece's limit of {SPM_MAX_SENTENCE_BYTES} UTF-8 bytes cannot "
            f"train the subword model ({'; '.join(over[:SHOWN_LINES])}{more}); counted in "
            f"tokenize.json as splits.{data.train_split}.dropped.{OVER_SPM_LIMIT}",
            stacklevel=2,
        )
    corpus[data.train_split] = train
    subwords = None
    if data.tokenizer.model_type == SUBWORD_NMT:  # merges on the text the model reads
        sources, targets = train_text[: len(train.src)], train_text[len(train.src) :]
        subwords = SubwordNmt.learn(sources, targets, data.tokenizer.vocab_size)
        train_text = subwords.sources(sources) + subwords.targets(targets)
    splits, metrics = {}, {}
    with atomic_directory(cfg.paths.tokenized, cfg.paths.outputs("tokenized")) as staging:
        model_path = train_tokenizer(train_text, data.tokenizer, staging / MODEL_FILE, cfg.seed)
        pretokenizer.write(model_path)
        if subwords is not None:
            subwords.write(model_path)
        tokenizer = Tokenizer.for_data(model_path, data)
        for split, pair in corpus.items():
            columns = encode_split(tokenizer, pair)
            splits[split] = datasets.Dataset.from_dict(columns)
            metrics[split] = _token_stats(columns, tokenizer.unk_id)
        metrics[data.train_split]["dropped"] = {OVER_SPM_LIMIT: len(over)}
        with console.library_bars(f"save {len(splits)} splits"):
            datasets.DatasetDict(splits).save_to_disk(str(staging / SPLITS_DIR))
        manifest = {
            "num_rows": {split: len(table) for split, table in splits.items()},
            "source_eos": data.tokenizer.source_eos,
            "files": _file_manifest(staging),
        }
        write_json_atomic(staging / MANIFEST_FILE, manifest)
    result = {"vocab_size": tokenizer.vocab_size, "model_type": data.tokenizer.model_type}
    result["splits"] = metrics
    write_json_atomic(Path(cfg.paths.metrics_dir) / "tokenize.json", result)
    return result


def _token_stats(columns: dict[str, list], unk_id: int) -> dict:
    stats = {"sentences": len(columns["src_ids"])}
    for side in ("src", "tgt"):
        ids = columns[f"{side}_ids"]
        tokens = sum(columns[f"{side}_len"])
        unknown = sum(row.count(unk_id) for row in ids)
        stats[f"{side}_tokens"] = tokens
        stats[f"{side}_unk_rate"] = unknown / max(tokens, 1)
    return stats


def load_tokenized(tokenized_dir: str | os.PathLike, source_eos: bool | None = None):
    """The saved DatasetDict, after checking it is intact (a damaged cache is a DataError).

    Every file listed in the manifest must exist with its recorded size and SHA-256, the
    splits must load, and each must have its recorded row count and the contract's columns.
    With `source_eos` given, the sources must have been encoded that way.
    """
    import datasets

    root = Path(tokenized_dir)
    manifest_path = root / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files, num_rows = manifest["files"], manifest["num_rows"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"{manifest_path}: tokenized data missing or incomplete ({type(err).__name__}); "
            f"{REPRO_HINT}"
        ) from None
    encoded_with = bool(manifest.get("source_eos", False))  # older manifests: no source eos
    if source_eos is not None and encoded_with != source_eos:
        raise DataError(
            f"{manifest_path}: sources were encoded with data.tokenizer.source_eos="
            f"{str(encoded_with).lower()}, but the config says {str(source_eos).lower()}; "
            f"{REPRO_HINT}"
        )
    for name, expected in files.items():
        path = root / name
        if not path.is_file():
            raise DataError(f"{path}: missing from the tokenized data; {REPRO_HINT}")
        if path.stat().st_size != expected["bytes"] or sha256_of(path) != expected["sha256"]:
            raise DataError(
                f"{path}: damaged (size or SHA-256 differs from {manifest_path}); {REPRO_HINT}"
            )
    try:
        loaded = datasets.load_from_disk(str(root / SPLITS_DIR))
    except Exception as err:  # datasets/pyarrow raise many types for a broken folder
        raise DataError(f"{root / SPLITS_DIR}: cannot be loaded ({err}); {REPRO_HINT}") from None
    for split, rows in num_rows.items():
        table = loaded.get(split)
        if table is None or len(table) != rows or not set(COLUMNS) <= set(table.column_names):
            raise DataError(
                f"{root / SPLITS_DIR}/{split}: expected {rows} rows with columns {COLUMNS}; "
                f"{REPRO_HINT}"
            )
    return loaded
