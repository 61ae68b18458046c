"""The prepare stage on the real Multi30k files, and on broken copies of slices of them."""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import shutil
import unicodedata
from pathlib import Path

import pytest

from pipeline.config import RAW_DIR_ENV
from pipeline.data.corpus import normalize, read_lines
from pipeline.data.prepared import prepare
from pipeline.errors import ConfigError, DataError
from tests.conftest import (
    SLICE,
    SPLITS,
    gzip_bomb,
    raw_lines,
    run_stage,
    snapshot,
    write_params,
)


def reference_normalize(line: str) -> str:
    """Independent statement of the rule: NFC, strip, collapse whitespace runs."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", line)).strip()


# ---- the real corpus -----------------------------------------------------------------------


def test_multi30k_en_de_accounts_for_every_pair(make_config, multi30k_dir, tmp_path):
    cfg = make_config()
    stats = prepare(cfg, cache_dir=tmp_path / "cache")
    expected_read = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    for split, read in expected_read.items():
        split_stats = stats["splits"][split]
        assert split_stats["read"] == read
        assert split_stats["kept"] + sum(split_stats["dropped"].values()) == read
        for lang, side in (("en", "src_words"), ("de", "tgt_words")):
            lines = Path(cfg.paths.prepared, f"{split}.{lang}").read_text("utf-8").split("\n")[:-1]
            assert len(lines) == split_stats["kept"]
            assert split_stats[side]["max"] == max(len(line.split()) for line in lines)
    # Test and val splits are never filtered; nothing in them is empty.
    assert stats["splits"]["test_2016_flickr"]["kept"] == 1000
    assert stats["splits"]["val"]["kept"] == 1014
    # The written metrics are the returned stats.
    written = json.loads(Path(cfg.paths.metrics_dir, "prepare.json").read_text())
    assert written == stats
    # Output = the reference normalisation of the raw lines, in corpus order.
    raw_val = raw_lines(multi30k_dir / "val.de.gz")
    out_val = Path(cfg.paths.prepared, "val.de").read_text("utf-8").split("\n")[:-1]
    assert out_val == [reference_normalize(line) for line in raw_val]
    # Training pairs dropped by the ratio filter really exceed max_ratio (3.0).
    assert stats["splits"]["train"]["dropped"]["ratio"] >= 1
    src = Path(cfg.paths.prepared, "train.en").read_text("utf-8").split("\n")[:-1]
    tgt = Path(cfg.paths.prepared, "train.de").read_text("utf-8").split("\n")[:-1]
    ratios = [
        max(len(s.split()), len(t.split())) / min(len(s.split()), len(t.split()))
        for s, t in zip(src, tgt)
    ]
    assert max(ratios) <= cfg.data.filter.max_ratio


def test_multi30k_de_fr_pair(make_config, multi30k_dir, tmp_path):
    cfg = make_config("data.src_lang=de", "data.tgt_lang=fr", "data.max_train_pairs=500")
    stats = prepare(cfg, cache_dir=tmp_path / "cache")
    assert stats["src_lang"] == "de" and stats["tgt_lang"] == "fr"
    assert stats["splits"]["train"]["kept"] == 500
    assert stats["splits"]["train"]["dropped"]["beyond_max_train_pairs"] > 0
    out = [
        Path(cfg.paths.prepared, f"train.{lang}").read_text("utf-8").split("\n")[:-1]
        for lang in ("de", "fr")
    ]
    raw = [
        [reference_normalize(line) for line in raw_lines(multi30k_dir / f"train.{lang}.gz")]
        for lang in ("de", "fr")
    ]
    # The kept pairs are the raw pairs in corpus order, with the filtered ones left out.
    remaining = iter(zip(*raw))
    assert all(pair in remaining for pair in zip(*out))
    assert list(zip(*out))[0] == next(iter(zip(*raw)))
    assert sorted(p.name for p in Path(cfg.paths.prepared).iterdir()) == sorted(
        f"{split}.{lang}" for split in SPLITS for lang in ("de", "fr")
    )


# ---- normalisation ---------------------------------------------------------------------------


def test_normalize_matches_reference_on_tricky_text():
    samples = ["  e\u0301t\u00e9\t\tin  Paris \r", "\u00a0a\u2003b\u3000c ", "A\u030a", ""]
    for text in samples:
        assert normalize(text) == reference_normalize(text)
    assert normalize("Cafe\u0301") == "Caf\u00e9"  # NFC composes


def test_bom_and_crlf_give_the_same_output(sliced_config, sliced_corpus, tmp_path):
    clean = sliced_config()
    prepare(clean)
    for lang in ("en", "de"):
        path = sliced_corpus / f"train.{lang}"
        text = path.read_text("utf-8")
        path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    windows = sliced_config()
    windows.paths.prepared = str(tmp_path / "windows" / "prepared")
    windows.paths.metrics_dir = str(tmp_path / "windows" / "metrics")
    prepare(windows)
    assert snapshot(Path(windows.paths.prepared)) == snapshot(Path(clean.paths.prepared))


def blank_line(path: Path, index: int) -> None:
    """Line `index + 1` of `path` white space only."""
    lines = path.read_text("utf-8").split("\n")[:-1]
    lines[index] = " \t \u00a0 "
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_whitespace_only_training_line_drops_its_pair_counted(sliced_config, sliced_corpus):
    blank_line(sliced_corpus / "train.de", 4)
    cfg = sliced_config()
    stats = prepare(cfg)["splits"]["train"]
    assert stats["dropped"]["empty"] == 1
    assert stats["kept"] + sum(stats["dropped"].values()) == stats["read"] == SLICE
    en = Path(cfg.paths.prepared, "train.en").read_text("utf-8").split("\n")
    raw_en = (sliced_corpus / "train.en").read_text("utf-8").split("\n")
    assert raw_en[4] not in en  # its pair went with it: the sides stay aligned


# ---- broken inputs: a named error, no partial output, the previous output intact ------------


def break_misaligned(folder: Path) -> tuple[str, ...]:
    path = folder / "val.de"
    lines = path.read_text("utf-8").split("\n")[:-1]
    path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    return str(folder / "val.en"), str(path), f"has {SLICE} lines", f"has {SLICE - 1}"


def break_utf8(folder: Path) -> tuple[str, ...]:
    path = folder / "train.en"
    data = path.read_bytes()
    line_starts = [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    offset = line_starts[6] + 3  # line 7, fourth byte
    path.write_bytes(data[:offset] + b"\xff" + data[offset:])
    return f"{path}:7:", f"byte offset {offset}", "invalid UTF-8"


def break_control_bytes(folder: Path) -> tuple[str, ...]:
    """Valid UTF-8 that is not text: every line of val.de (never filtered) control bytes."""
    path = folder / "val.de"
    path.write_text("\x00\x01\x02\x03\x7f\n" * SLICE, encoding="utf-8")
    return f"{path}:1:", "control character U+0000 at column 1"


def break_no_letters(folder: Path) -> tuple[str, ...]:
    """Lines of digits and punctuation only: text, but in no language."""
    path = folder / "val.en"
    path.write_text("".join(f"{n} ... {n * 7} !\n" for n in range(SLICE)), encoding="utf-8")
    return "split 'val'", str(path), "no letter in any of its"


def break_empty(folder: Path) -> tuple[str, ...]:
    (folder / "val.en").write_bytes(b"")
    return f"{folder / 'val.en'}:1", "empty"


def break_blank_test_line(folder: Path) -> tuple[str, ...]:
    """A test split is scored whole: a pair without text is not dropped from it, it is named."""
    blank_line(folder / "test_2016_flickr.de", 4)
    return f"{folder / 'test_2016_flickr.de'}:5: empty", "split 'test_2016_flickr'"


def break_missing_file(folder: Path) -> tuple[str, ...]:
    (folder / "test_2016_flickr.de").unlink()
    return "test_2016_flickr.de", RAW_DIR_ENV, "data.download=true"


def break_missing_dir(folder: Path) -> tuple[str, ...]:
    shutil.rmtree(folder)
    return str(folder), "does not exist", RAW_DIR_ENV


BREAKERS = [break_misaligned, break_utf8, break_control_bytes, break_no_letters, break_empty,
            break_blank_test_line]  # fmt: skip


@pytest.mark.parametrize("breaker", [*BREAKERS, break_missing_file, break_missing_dir])
def test_bad_input_is_named_and_leaves_no_partial_output(breaker, sliced_config, sliced_corpus):
    cfg = sliced_config()
    expected = breaker(sliced_corpus)
    with pytest.raises(DataError) as err:
        prepare(cfg)
    for fragment in expected:
        assert fragment in str(err.value)
    prepared = Path(cfg.paths.prepared)
    assert not prepared.exists() and not Path(cfg.paths.metrics_dir, "prepare.json").exists()
    assert not prepared.parent.exists() or list(prepared.parent.iterdir()) == []


@pytest.mark.parametrize("breaker", [*BREAKERS, break_missing_file])
def test_bad_input_keeps_the_previous_good_output(breaker, sliced_config, sliced_corpus):
    cfg = sliced_config()
    prepare(cfg)
    before_prepared = snapshot(Path(cfg.paths.prepared))
    before_metrics = snapshot(Path(cfg.paths.metrics_dir))
    breaker(sliced_corpus)
    with pytest.raises(DataError):
        prepare(cfg)
    assert snapshot(Path(cfg.paths.prepared)) == before_prepared
    assert snapshot(Path(cfg.paths.metrics_dir)) == before_metrics
    leftovers = [
        p.name for p in Path(cfg.paths.prepared).parent.iterdir() if p.name.startswith(".")
    ]
    assert leftovers == []


def test_invalid_utf8_in_a_gzip_file(sliced_corpus, sliced_config):
    data = (sliced_corpus / "val.de").read_bytes()
    line_starts = [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    offset = line_starts[11]  # the first byte of line 12
    (sliced_corpus / "val.de").unlink()
    with gzip.open(sliced_corpus / "val.de.gz", "wb") as handle:
        handle.write(data[:offset] + b"\xc3\x28" + data[offset:])  # a broken 2-byte sequence
    with pytest.raises(DataError, match=rf"val\.de\.gz:12: invalid UTF-8.*byte offset {offset}"):
        read_lines(sliced_corpus / "val.de.gz")
    with pytest.raises(DataError, match=r"val\.de\.gz:12"):
        prepare(sliced_config())


def test_test_split_is_never_filtered(sliced_config):
    with pytest.raises(ConfigError, match="data.filter.apply_to"):
        prepare(sliced_config("data.filter.apply_to=[train,test_2016_flickr]"))


def test_filter_applies_to_train_only(sliced_config, sliced_corpus):
    # Give pair 3 of train and of the test split a source 5x longer than its target.
    for split in ("train", "test_2016_flickr"):
        path = sliced_corpus / f"{split}.en"
        lines = path.read_text("utf-8").split("\n")[:-1]
        lines[3] = " ".join(["word"] * 5 * len(lines[3].split()))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = prepare(sliced_config())["splits"]
    assert stats["train"]["dropped"]["ratio"] == 1 and stats["train"]["kept"] == SLICE - 1
    assert stats["test_2016_flickr"]["kept"] == SLICE


# ---- the stage entry point -------------------------------------------------------------------


def test_prepare_stage_cli(tmp_path, multi30k_dir):
    """`python -m pipeline.stages.prepare` reads params.yaml in the working directory."""
    write_params(tmp_path, "experiment=smoke", "data.download=false")
    env = {**os.environ, RAW_DIR_ENV: str(multi30k_dir)}
    done = run_stage("prepare", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "data/prepared/train.en").read_text("utf-8").split("\n")) == 2001
    env[RAW_DIR_ENV] = str(tmp_path / "nowhere")
    failed = run_stage("prepare", tmp_path, env)
    assert failed.returncode == 2
    assert (
        failed.stderr.startswith("error: missing corpus files") and "Traceback" not in failed.stderr
    )
    assert (tmp_path / "data/prepared/train.en").exists()  # the good output survived


def test_prepare_stage_refuses_control_bytes_with_exit_2(tmp_path, sliced_corpus):
    """A corpus of control bytes is valid UTF-8: the stage names the file and line and exits 2
    before it writes anything (tokenize would fail later, naming no file)."""
    write_params(tmp_path, "data.download=false")
    expected = break_control_bytes(sliced_corpus)
    failed = run_stage("prepare", tmp_path, {**os.environ, RAW_DIR_ENV: str(sliced_corpus)})
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.startswith("error: ") and "Traceback" not in failed.stderr
    assert all(fragment in failed.stderr for fragment in expected)
    assert not (tmp_path / "data").exists() and not (tmp_path / "metrics").exists()


# ---- bounds: a gzip bomb and an endless line are refused as they are read ---------------------


@pytest.mark.parametrize(
    ("line", "bound"),
    [(b"a man is sitting on a bench .\n", "data.limits.max_file_mb"),
     (b"x" * 1024, "data.limits.max_line_bytes")],  # one endless line
    ids=["many_lines", "endless_line"],
)  # fmt: skip
def test_a_gzip_bomb_is_refused_naming_the_file_and_the_bound(
    sliced_corpus, sliced_config, line, bound
):
    """Streamed: refused once the bound is crossed, before the rest is decompressed; nothing
    is written."""
    (sliced_corpus / "train.en").unlink()
    bomb = sliced_corpus / "train.en.gz"
    gzip_bomb(bomb, 16, line)
    assert bomb.stat().st_size < 100_000
    cfg = sliced_config("data.limits.max_file_mb=4")
    where = re.escape(str(bomb)) + ("" if bound.endswith("max_file_mb") else ":1")
    with pytest.raises(DataError, match=rf"^{where}: .*{re.escape(bound)}"):
        read_lines(bomb, cfg.data.limits)
    with pytest.raises(DataError, match=rf"^{where}: .*{re.escape(bound)}"):
        prepare(cfg)
    assert not Path(cfg.paths.prepared).exists() and not Path(cfg.paths.metrics_dir).exists()


def test_lines_and_offsets_are_the_same_across_read_blocks(tmp_path):
    """Lines split over the blocks the file is read in, a BOM, a missing final newline."""
    lines = [("ä" * (i % 700)) + f" {i}" for i in range(3000)]  # ~2.5 MiB: several blocks
    path = tmp_path / "long.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(codecs.BOM_UTF8 + "\n".join(lines).encode("utf-8"))
    assert read_lines(path) == lines
    data = "\n".join(lines).encode("utf-8") + b"\n"
    offset = data.index(b"\n", 2_000_000) + 5  # inside a line, past the first block
    (tmp_path / "broken").write_bytes(data[:offset] + b"\xff" + data[offset:])
    number = data.count(b"\n", 0, offset) + 1
    with pytest.raises(DataError, match=rf"broken:{number}: invalid UTF-8 .*offset {offset} "):
        read_lines(tmp_path / "broken")
