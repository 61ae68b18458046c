"""Where the raw corpus comes from (`data.source`), read and validated, not yet normalised:
  multi30k  a local folder `data.raw_dir` holding `{split}.{lang}.gz` or plain `{split}.{lang}`
            (the environment variable MULTI30K_DIR overrides it, see `pipeline.config`). With no
            local copy and `data.download`, `{data.url}/{split}.{lang}.gz` is fetched into a cache
            folder and checked against `data.sha256` (see `pipeline.data.download`). A local
            folder is trusted as it is (it may hold plain text); downloads and cached downloads
            are always checked.
  text      any aligned pair of plain (or .gz) text files per split: `data.text_files`.
  hf        a Hugging Face dataset with a `translation` column ({lang: sentence} per row):
            `datasets.load_dataset(data.hf_path, data.hf_name)`; a hub name or a local folder.
A missing file is a `DataError` with the download / MULTI30K_DIR hint.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from pipeline.config import RAW_DIR_ENV
from pipeline.config_schema import DataConfig
from pipeline.data.corpus import ParallelText, corpus_splits, read_pair
from pipeline.data.download import (
    check_download_url,
    check_verifiable,
    download_file,
    verify_checksum,
)
from pipeline.errors import ConfigError, DataError

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "transformer-ablations"


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
    return download_file(f"{data.url.rstrip('/')}/{name}", cached, expected, data.limits)


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


def not_a_folder(path: Path) -> str | None:
    """What `path` is instead of a folder that can be read (None: a folder, or nothing at
    all): a download is no answer to a corpus folder that exists but cannot be listed."""
    if not os.path.lexists(path):
        return None
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link loop"
        if err.errno == errno.ENOENT:
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return f"unreadable ({err.strerror})"
    if stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    return "a file" if stat.S_ISREG(mode) else "a special file"


def locate_multi30k(
    data: DataConfig, splits: list[str], cache_dir: Path
) -> dict[tuple[str, str], Path]:
    """{(split, lang): file} of every split in both languages: the local copy, else a verified
    download (see `multi30k_file`); one error lists every file that is missing. A `data.raw_dir`
    that exists but is no folder is an error naming it, before any download."""
    problem = not_a_folder(Path(data.raw_dir))
    if problem:
        raise DataError(
            f"data.raw_dir {data.raw_dir} is {problem}, not a folder of corpus files: point "
            f"data.raw_dir or the {RAW_DIR_ENV} environment variable at a Multi30k copy"
        )
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
    return {split: read_pair(split, paths[split, src], paths[split, tgt], data.limits)
            for split in splits}  # fmt: skip


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
    return {split: read_pair(split, paths[split]["src"], paths[split]["tgt"], data.limits)
            for split in splits}  # fmt: skip


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
