"""A parallel corpus: aligned splits read, validated, normalised, filtered and measured (the
library behind the `prepare` stage; where the raw text comes from is `pipeline.data.sources`).

Normalisation, the same for every source and split (what `prepare` writes):
  - a UTF-8 byte-order mark at the start of a file is dropped;
  - lines end at "\\n" only (so U+2028, form feeds etc. inside a line cannot shift the alignment);
    the "\\r" of a CRLF line end is whitespace and goes with the next rule;
  - Unicode NFC;
  - whitespace: stripped at both ends, every run of Unicode whitespace (space, tab, "\\r", NBSP,
    ...) collapsed into one space.

Validation happens on everything before anything is written; each problem is a `DataError`
naming the file and line: invalid UTF-8 (line and byte offset), control characters (valid
UTF-8, but not text), source and target line counts that differ, an empty split, a side of a
split with no letter in any line.
Empty (after normalisation) pairs are dropped and counted; the length/ratio filter
`data.filter` drops training pairs (the splits in `filter.apply_to`, never a test split).
"""

from __future__ import annotations

import codecs
import gzip
import re
import unicodedata
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.atomic import write_text_atomic
from pipeline.config_schema import DataConfig, LimitsConfig
from pipeline.errors import ConfigError, DataError

_READ_BLOCK = 1 << 20  # bytes decompressed at a time
PERCENTILES = (50, 90, 99)  # of sentence lengths in words, reported in metrics/prepare.json

# Reasons a pair is dropped (keys of the `dropped` counts in metrics/prepare.json).
EMPTY, TOO_SHORT, TOO_LONG, RATIO, OVER_MAX_PAIRS = (
    "empty",
    "too_short",
    "too_long",
    "ratio",
    "beyond_max_train_pairs",
)
DROP_REASONS = (EMPTY, TOO_SHORT, TOO_LONG, RATIO, OVER_MAX_PAIRS)

# Control characters that are not whitespace (C0 and C1, but tab, line ends, FS/GS/RS/US and
# NEL, which normalisation turns into spaces): no language writes them, and a corpus of them
# passes every other check only to leave the subword model nothing to learn.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
_LETTER = re.compile(r"[^\W\d_]")  # any letter of any script


@dataclass
class ParallelText:
    """One split: aligned source/target sentences and where they came from (for messages)."""

    split: str
    src: list[str]
    tgt: list[str]
    src_origin: str
    tgt_origin: str


def normalize(text: str) -> str:
    """NFC, then strip and collapse every run of Unicode whitespace into one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def _raw_lines(path: Path, limits: LimitsConfig) -> Iterator[tuple[int, bytes]]:
    """(byte offset in the decompressed file, line without its "\\n") of every line, read in
    blocks: a file or a line past `limits` is a DataError naming the file (and line) as soon
    as the bound is crossed, before the rest is decompressed (a gzip bomb never fills memory)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    max_file = limits.max_file_bytes
    total, number, start, pending = 0, 1, 0, b""
    try:
        with opener(path, "rb") as handle:
            while block := handle.read(_READ_BLOCK):
                total += len(block)
                if total > max_file:
                    raise DataError(
                        f"{path}: more than {limits.max_file_mb:g} MiB of text (decompressed), "
                        "the bound data.limits.max_file_mb; the file is not a corpus (a gzip "
                        "bomb?) or the bound is too low for it: raise data.limits.max_file_mb"
                    )
                *complete, pending = (pending + block).split(b"\n")
                for line in complete:
                    _check_line_bytes(path, number, len(line), limits)
                    yield start, line
                    start, number = start + len(line) + 1, number + 1
                _check_line_bytes(path, number, len(pending), limits)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(
            f"{path}: cannot read ({err}); the file is damaged, replace it with a fresh copy"
        ) from None
    if pending:  # a final newline does not make an extra empty line
        yield start, pending


def _check_line_bytes(path: Path, number: int, size: int, limits: LimitsConfig) -> None:
    if size > limits.max_line_bytes:
        raise DataError(
            f"{path}:{number}: the line is longer than {limits.max_line_bytes} bytes "
            "(data.limits.max_line_bytes), not a sentence; fix the file, or raise the bound"
        )


def check_size(path: Path, limits: LimitsConfig) -> None:
    """Refuse a file whose decompressed text or one of whose lines is past `limits` (the
    check stage, before prepare runs), reading it in blocks."""
    for _ in _raw_lines(path, limits):
        pass


def read_lines(path: Path, limits: LimitsConfig | None = None) -> list[str]:
    """The lines of a UTF-8 text file (gzip when the name ends in .gz), not yet normalised.

    A leading byte-order mark is dropped and lines are split at "\\n" only; a final newline
    does not make an extra empty line. Invalid UTF-8 is a DataError naming the line and the
    byte offset (in the decompressed bytes for a .gz file). The file is read in blocks, and
    a file or line past `limits` (default: `LimitsConfig`'s) is refused naming it.
    """
    lines = []
    for number, (start, raw) in enumerate(_raw_lines(path, limits or LimitsConfig()), 1):
        bom = len(codecs.BOM_UTF8) if start == 0 and raw.startswith(codecs.BOM_UTF8) else 0
        try:
            lines.append(raw[bom:].decode("utf-8"))
        except UnicodeDecodeError as err:
            column = bom + err.start
            raise DataError(
                f"{path}:{number}: invalid UTF-8 (byte {raw[column : column + 1]!r} at byte "
                f"offset {start + column} of the file, column byte {column}); re-encode the "
                "file as UTF-8 or fix that line"
            ) from None
    return lines


def read_pair(
    split: str, src_path: Path, tgt_path: Path, limits: LimitsConfig | None = None
) -> ParallelText:
    """Read an aligned file pair and check that both have the same, non-zero number of lines."""
    src, tgt = read_lines(src_path, limits), read_lines(tgt_path, limits)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not lines:
            raise DataError(f"{path}:1: split '{split}' is empty (the file has no lines)")
    if len(src) != len(tgt):
        raise DataError(
            f"split '{split}': {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            "line N of the source must translate line N of the target (the first "
            f"{min(len(src), len(tgt))} lines can pair at most, so line "
            f"{min(len(src), len(tgt)) + 1} is where one file runs past the other)"
        )
    return ParallelText(split, src, tgt, str(src_path), str(tgt_path))


def corpus_splits(data: DataConfig) -> list[str]:
    """[train, val, *tests] as configured; names must be distinct and filters legal."""
    splits = [data.train_split, data.val_split, *data.test_splits]
    if len(set(splits)) != len(splits):
        raise ConfigError(
            f"config keys 'data.train_split', 'data.val_split', 'data.test_splits': split names "
            f"must be distinct, got {splits}"
        )
    for name in data.filter.apply_to:
        if name in data.test_splits:
            raise ConfigError(
                f"config key 'data.filter.apply_to': '{name}' is a test split; test sets are "
                "never filtered (scores must cover every reference), remove it"
            )
        if name not in splits:
            raise ConfigError(
                f"config key 'data.filter.apply_to': unknown split '{name}', expected some of "
                f"{splits[:2]}"
            )
    return splits


def drop_reason(src: str, tgt: str, data: DataConfig, filtered: bool) -> str | None:
    """Why a normalised pair is dropped, or None to keep it."""
    if not src or not tgt:
        return EMPTY
    if not filtered:
        return None
    rule = data.filter
    src_words, tgt_words = len(src.split(" ")), len(tgt.split(" "))
    if min(src_words, tgt_words) < rule.min_words:
        return TOO_SHORT
    if max(src_words, tgt_words) > rule.max_words:
        return TOO_LONG
    if max(src_words, tgt_words) / min(src_words, tgt_words) > rule.max_ratio:
        return RATIO
    return None


def length_summary(sentences: list[str]) -> dict[str, float]:
    words = np.array([len(s.split(" ")) for s in sentences])
    summary = {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(words, PERCENTILES))}
    summary["max"] = int(words.max())
    return summary


def check_text(lines: Sequence[str], origin: str) -> None:
    """Refuse a line holding a control character (not text), naming file, line and column."""
    for number, line in enumerate(lines, 1):
        if found := _CONTROL.search(line):
            raise DataError(
                f"{origin}:{number}: control character U+{ord(found.group()):04X} at column "
                f"{found.start() + 1}: the line is not text; remove the character or the line"
            )


def check_letters(split: str, lines: Sequence[str], origin: str) -> None:
    """Refuse a side of a split in which no line holds a letter: it is not a language."""
    if not any(_LETTER.search(line) for line in lines):
        raise DataError(
            f"split '{split}': {origin} has no letter in any of its {len(lines)} kept lines; "
            "it is not text in a language (check that the file is the right one)"
        )


def clean_split(raw: ParallelText, data: DataConfig) -> tuple[ParallelText, dict]:
    """Check, normalise, drop empty training pairs (one in a split scored whole, val or test,
    is an error naming its line), filter (train-like splits), cap training pairs; with stats."""
    check_text(raw.src, raw.src_origin)
    check_text(raw.tgt, raw.tgt_origin)
    filtered = raw.split in data.filter.apply_to
    kept_whole = not filtered and raw.split != data.train_split  # val and test: scored whole
    dropped = dict.fromkeys(DROP_REASONS, 0)
    src, tgt = [], []
    for number, (src_line, tgt_line) in enumerate(zip(raw.src, raw.tgt), 1):
        pair = normalize(src_line), normalize(tgt_line)
        reason = drop_reason(*pair, data, filtered)
        if reason == EMPTY and kept_whole:
            origin = raw.src_origin if not pair[0] else raw.tgt_origin
            raise DataError(
                f"{origin}:{number}: empty (or only white space) in split '{raw.split}', which "
                "is scored whole, never filtered: give the pair its text, or remove line "
                f"{number} from both {raw.src_origin} and {raw.tgt_origin}"
            )
        if reason is None:
            src.append(pair[0])
            tgt.append(pair[1])
        else:
            dropped[reason] += 1
    limit = data.max_train_pairs
    if raw.split == data.train_split and limit is not None and len(src) > limit:
        dropped[OVER_MAX_PAIRS] += len(src) - limit
        src, tgt = src[:limit], tgt[:limit]
    if not src:
        raise DataError(
            f"split '{raw.split}' ({raw.src_origin}, {raw.tgt_origin}) is empty after cleaning: "
            f"all {len(raw.src)} pairs were dropped ({ {k: v for k, v in dropped.items() if v} }); "
            "check the files or relax data.filter"
        )
    check_letters(raw.split, src, raw.src_origin)
    check_letters(raw.split, tgt, raw.tgt_origin)
    stats = {
        "read": len(raw.src),
        "kept": len(src),
        "dropped": dropped,
        "src_words": length_summary(src),
        "tgt_words": length_summary(tgt),
    }
    return ParallelText(raw.split, src, tgt, raw.src_origin, raw.tgt_origin), stats


def write_lines(path: Path, lines: list[str]) -> None:
    """One line each, atomically (a full disk or read-only place is an error naming `path`)."""
    write_text_atomic(path, "".join(f"{line}\n" for line in lines))
