"""Read, validate, normalise and filter a parallel corpus: the library behind the `prepare` stage.

Sources (`data.source`):
  multi30k  a local folder `data.raw_dir` holding `{split}.{lang}.gz` or plain `{split}.{lang}`
            (the environment variable MULTI30K_DIR overrides it, see `pipeline.config`). With no
            local copy and `data.download`, `{data.url}/{split}.{lang}.gz` is fetched into a cache
            folder and checked against `data.sha256`. A local folder is trusted as it is (it may
            hold plain text); downloads and cached downloads are always checked. Refused before
            the first request: a URL other than https:// (a file:// copy, or http:// to this
            machine's loopback, where no network can alter it, excepted) and a file with no
            SHA-256 unless `data.allow_unverified` names it.
  text      any aligned pair of plain (or .gz) text files per split: `data.text_files`.
  hf        a Hugging Face dataset with a `translation` column ({lang: sentence} per row):
            `datasets.load_dataset(data.hf_path, data.hf_name)`; a hub name or a local folder.

Normalisation, the same for every source and split (what `prepare` writes):
  - a UTF-8 byte-order mark at the start of a file is dropped;
  - lines end at "\\n" only (so U+2028, form feeds etc. inside a line cannot shift the alignment);
    the "\\r" of a CRLF line end is whitespace and goes with the next rule;
  - Unicode NFC;
  - whitespace: stripped at both ends, every run of Unicode whitespace (space, tab, "\\r", NBSP,
    ...) collapsed into one space.

Validation happens on everything before anything is written; each problem is a `DataError`
naming the file and line: missing files (with the download / MULTI30K_DIR hint), invalid UTF-8
(line and byte offset), control characters (valid UTF-8, but not text), source and target line
counts that differ, an empty split, a side of a split with no letter in any line.
Empty (after normalisation) pairs are dropped and counted; the length/ratio filter
`data.filter` drops training pairs (the splits in `filter.apply_to`, never a test split).
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import hashlib
import ipaddress
import os
import re
import shutil
import tempfile
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from pipeline.atomic import write_json_atomic
from pipeline.config import RAW_DIR_ENV
from pipeline.config_schema import Config, DataConfig
from pipeline.errors import ConfigError, DataError, disk_full_error, is_disk_full

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "transformer-ablations"
DOWNLOAD_TIMEOUT_S = 60.0  # per network read; a stalled server fails instead of hanging
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

# tempfile creates private (0700/0600) entries; outputs get the usual umask-based modes.
_UMASK = os.umask(0)
os.umask(_UMASK)


@dataclass
class ParallelText:
    """One split: aligned source/target sentences and where they came from (for messages)."""

    split: str
    src: list[str]
    tgt: list[str]
    src_origin: str
    tgt_origin: str


# --------------------------------------------------------------------------------------------
# Normalisation and reading
# --------------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """NFC, then strip and collapse every run of Unicode whitespace into one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (gzip when the name ends in .gz), not yet normalised.

    A leading byte-order mark is dropped and lines are split at "\\n" only; a final newline
    does not make an extra empty line. Invalid UTF-8 is a DataError naming the line and the
    byte offset (in the decompressed bytes for a .gz file).
    """
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                data = handle.read()
        else:
            data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(
            f"{path}: cannot read ({err}); the file is damaged, replace it with a fresh copy"
        ) from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = bom + err.start
        line = data.count(b"\n", 0, offset) + 1
        line_start = data.rfind(b"\n", 0, offset) + 1
        raise DataError(
            f"{path}:{line}: invalid UTF-8 (byte {data[offset : offset + 1]!r} at byte offset "
            f"{offset} of the file, column byte {offset - line_start}); re-encode the file as "
            "UTF-8 or fix that line"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def read_pair(split: str, src_path: Path, tgt_path: Path) -> ParallelText:
    """Read an aligned file pair and check that both have the same, non-zero number of lines."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
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


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksum(path: Path, name: str, expected: str | None, origin: str) -> None:
    """Compare `path` with its known SHA-256; no known checksum (a file the user accepted
    unverified, see `check_verifiable`) is a warning."""
    if not expected:
        warnings.warn(
            f"{name} (from {origin}): no SHA-256 in data.sha256, the file is unverified "
            "(accepted: data.allow_unverified names it)",
            stacklevel=2,
        )
        return
    actual = sha256_of(path)
    if actual != expected.lower():
        raise DataError(
            f"{name} (from {origin}): SHA-256 mismatch, expected {expected} but got {actual}; "
            "the download is corrupt (it was discarded) or data.sha256 is outdated"
        )


def check_download_url(url: str, redirected_from: str | None = None) -> None:
    """Refuse a download URL that a network could tamper with: `https://`, a local `file://`
    copy, or plain `http://` to this machine (loopback: no network in between) only. The
    same holds for every redirect a download follows."""
    parsed = urllib.parse.urlsplit(url)
    scheme, host = parsed.scheme.lower(), parsed.hostname or ""
    if scheme in ("https", "file") or (scheme == "http" and _is_loopback(host)):
        return
    what = f"{redirected_from} redirects to {url}, which" if redirected_from else url
    raise ConfigError(
        f"config key 'data.url': {what} is not an https:// URL; files fetched over plain HTTP "
        "(or another scheme) can be altered on the way. Use the https:// address, or put the "
        f"files in data.raw_dir (or set {RAW_DIR_ENV})"
    )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL `check_download_url` accepts: https cannot hand the
    download over to plain http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_download_url(newurl, redirected_from=req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_CheckedRedirects)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def check_verifiable(data: DataConfig, names: Sequence[str]) -> None:
    """Refuse to download files with no SHA-256 in `data.sha256` unless `data.allow_unverified`
    names each of them: what arrives could be anything."""
    unverified = [n for n in names if not data.sha256.get(n) and n not in data.allow_unverified]
    if unverified:
        listed = ", ".join(unverified)
        raise DataError(
            f"no SHA-256 in data.sha256 for {listed}: a download cannot be verified, so it is "
            f"refused. Add their checksums to data.sha256, put the files in data.raw_dir (or "
            f"set {RAW_DIR_ENV}), or accept them unverified by name: "
            f"data.allow_unverified=[{','.join(unverified)}]"
        )


def download_file(url: str, dest: Path, expected_sha256: str | None) -> Path:
    """Fetch `url` into `dest` (atomically, with a progress bar) and verify its SHA-256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.chmod(part, 0o666 & ~_UMASK)
    try:
        with (
            os.fdopen(fd, "wb") as out,
            _OPENER.open(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
        ):
            total = response.headers.get("Content-Length")
            with tqdm(
                total=int(total) if total else None,
                unit="B",
                unit_scale=True,
                desc=f"download {dest.name}",
            ) as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
        verify_checksum(Path(part), dest.name, expected_sha256, url)
        os.replace(part, dest)
    except (urllib.error.URLError, OSError) as err:
        raise DataError(
            f"could not download {url} ({getattr(err, 'reason', err)}); check the network and "
            f"data.url, or put the files in data.raw_dir (or set {RAW_DIR_ENV})"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
    return dest


def local_multi30k_file(data: DataConfig, split: str, lang: str) -> Path | None:
    """The local copy of (split, lang) in `data.raw_dir` (gzip or plain text), if any."""
    raw_dir = Path(data.raw_dir)
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (raw_dir / name).is_file():
            return raw_dir / name
    return None


def multi30k_file(data: DataConfig, split: str, lang: str, cache_dir: Path) -> Path | None:
    """The file for (split, lang): the local copy, else a verified download; None if absent."""
    local = local_multi30k_file(data, split, lang)
    if local is not None:
        return local
    if not (data.download and data.url):
        return None
    name = f"{split}.{lang}.gz"
    check_download_url(data.url)
    check_verifiable(data, [name])
    cached = cache_dir / name
    expected = data.sha256.get(name)
    if cached.is_file():
        try:
            verify_checksum(cached, name, expected, str(cached))
            return cached
        except DataError:
            cached.unlink()  # a damaged cached copy: fetch it again
    return download_file(f"{data.url.rstrip('/')}/{name}", cached, expected)


def _missing_files_error(data: DataConfig, missing: list[str]) -> DataError:
    raw_dir = Path(data.raw_dir)
    where = "" if raw_dir.is_dir() else f" (the directory {raw_dir} does not exist)"
    how = f"point data.raw_dir or the {RAW_DIR_ENV} environment variable at a Multi30k copy"
    if not data.download:
        how += ", or set data.download=true to fetch it from data.url"
    if any(name.rsplit(".", 1)[0] in data.test_splits for name in missing):
        how += ", or remove the split from data.test_splits"
    return DataError(
        f"missing corpus files in {raw_dir}{where}: {', '.join(missing)} "
        f"(each as {{split}}.{{lang}}.gz or plain {{split}}.{{lang}}); {how}"
    )


def locate_multi30k(
    data: DataConfig, splits: list[str], cache_dir: Path
) -> dict[tuple[str, str], Path]:
    """{(split, lang): file} of every split in both languages: the local copy, else a verified
    download (see `multi30k_file`); one error lists every file that is missing."""
    langs = (data.src_lang, data.tgt_lang)
    if data.download and data.url:  # every download allowed before the first one starts
        to_fetch = [f"{split}.{lang}.gz" for split in splits for lang in langs
                    if local_multi30k_file(data, split, lang) is None]  # fmt: skip
        if to_fetch:
            check_download_url(data.url)
            check_verifiable(data, to_fetch)
    paths, missing = {}, []
    for split in splits:
        for lang in (data.src_lang, data.tgt_lang):
            path = multi30k_file(data, split, lang, cache_dir / "multi30k")
            if path is None:
                missing.append(f"{split}.{lang}")
            paths[split, lang] = path
    if missing:
        raise _missing_files_error(data, missing)
    return paths


def read_multi30k(data: DataConfig, splits: list[str], cache_dir: Path) -> dict[str, ParallelText]:
    paths = locate_multi30k(data, splits, cache_dir)
    src, tgt = data.src_lang, data.tgt_lang
    return {split: read_pair(split, paths[split, src], paths[split, tgt]) for split in splits}


def text_file_paths(data: DataConfig, splits: list[str]) -> dict[str, dict[str, Path]]:
    """{split: {src: path, tgt: path}} of `data.text_files`, every file checked to exist."""
    missing = [s for s in splits if set(data.text_files.get(s, {})) != {"src", "tgt"}]
    if missing:
        raise ConfigError(
            f"config key 'data.text_files': splits {missing} need {{src: path, tgt: path}} "
            f"(source=text), got {dict(data.text_files)}"
        )
    paths = {s: {side: Path(data.text_files[s][side]) for side in ("src", "tgt")} for s in splits}
    absent = [str(p) for pair in paths.values() for p in pair.values() if not p.is_file()]
    if absent:
        raise DataError(f"missing corpus files (data.text_files): {', '.join(absent)}")
    return paths


def read_text_files(data: DataConfig, splits: list[str]) -> dict[str, ParallelText]:
    paths = text_file_paths(data, splits)
    return {split: read_pair(split, paths[split]["src"], paths[split]["tgt"]) for split in splits}


def read_hf(data: DataConfig, splits: list[str], cache_dir: Path | None) -> dict[str, ParallelText]:
    import datasets

    ref = data.hf_path + (f" ({data.hf_name})" if data.hf_name else "")
    try:
        loaded = datasets.load_dataset(
            data.hf_path, data.hf_name, cache_dir=str(cache_dir / "hf") if cache_dir else None
        )
    except Exception as err:  # datasets raises many types (FileNotFound, DatasetNotFound, ...)
        raise DataError(
            f"data.hf_path={ref}: cannot load the dataset ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check data.hf_path / data.hf_name"
        ) from None
    absent = [s for s in splits if s not in loaded]
    if absent:
        raise DataError(
            f"{ref}: no split(s) {absent} (it has {sorted(loaded)}); set data.train_split, "
            "data.val_split and data.test_splits to its split names"
        )
    result = {}
    for split in splits:
        table = loaded[split]
        origin = f"{ref}[{split}]"
        if "translation" not in table.column_names:
            raise DataError(f"{origin}: no 'translation' column (it has {table.column_names})")
        if len(table) == 0:
            raise DataError(f"{origin}: split '{split}' is empty")
        src, tgt = [], []
        for row, pair in enumerate(table["translation"]):
            for lang, side in ((data.src_lang, src), (data.tgt_lang, tgt)):
                if not isinstance(pair, dict) or lang not in pair:
                    raise DataError(
                        f"{origin} row {row}: translation has no '{lang}' "
                        f"(languages {sorted(pair) if isinstance(pair, dict) else pair}); "
                        "check data.src_lang / data.tgt_lang"
                    )
                side.append(pair[lang] or "")
        result[split] = ParallelText(
            split, src, tgt, f"{origin}.{data.src_lang}", f"{origin}.{data.tgt_lang}"
        )
    return result


def read_corpus(data: DataConfig, cache_dir: Path | None = None) -> dict[str, ParallelText]:
    """Every configured split from `data.source`, validated, not yet normalised."""
    splits = corpus_splits(data)
    if data.source == "multi30k":
        return read_multi30k(data, splits, cache_dir or DEFAULT_CACHE_DIR)
    if data.source == "text":
        return read_text_files(data, splits)
    return read_hf(data, splits, cache_dir)


# --------------------------------------------------------------------------------------------
# Cleaning: normalise, drop empty pairs, filter
# --------------------------------------------------------------------------------------------


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
    """Check, normalise, drop empty pairs, filter (train-like splits), cap training pairs; with
    stats."""
    check_text(raw.src, raw.src_origin)
    check_text(raw.tgt, raw.tgt_origin)
    filtered = raw.split in data.filter.apply_to
    dropped = dict.fromkeys(DROP_REASONS, 0)
    src, tgt = [], []
    for src_line, tgt_line in zip(raw.src, raw.tgt):
        pair = normalize(src_line), normalize(tgt_line)
        reason = drop_reason(*pair, data, filtered)
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


# --------------------------------------------------------------------------------------------
# Atomic outputs (shared with the tokenize stage)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp folder beside `target`; on success it replaces `target`.

    On an exception the temp folder is removed and `target` (a previous good output) is left
    untouched; a full disk is a DiskFullError that says so. The swap is two renames on one
    filesystem: the old output moves aside, the new one takes its name, then the old one is
    deleted.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(staging, 0o777 & ~_UMASK)
    previous = None
    try:
        yield staging
        if target.exists():  # (a new folder: may also find the disk full)
            previous = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(err):
            raise disk_full_error(target, previous_existed=target.exists()) from err
        raise
    if previous is not None:
        os.replace(target, previous / target.name)
    os.replace(staging, target)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


# --------------------------------------------------------------------------------------------
# The prepare stage
# --------------------------------------------------------------------------------------------


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
    with atomic_directory(cfg.paths.prepared) as staging:
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
