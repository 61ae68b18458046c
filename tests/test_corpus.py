"""The prepare stage on the real Multi30k files, and on broken copies of slices of them."""

from __future__ import annotations

import errno
import functools
import gzip
import hashlib
import http.server
import ipaddress
import json
import os
import re
import shutil
import socket
import threading
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import RAW_DIR_ENV
from pipeline.config_schema import Config
from pipeline.data.corpus import (
    atomic_directory,
    check_download_url,
    normalize,
    prepare,
    read_lines,
)
from pipeline.errors import ConfigError, DataError, DiskFullError
from tests.conftest import run_stage, write_params

SPLITS = ("train", "val", "test_2016_flickr")
SLICE = 40  # lines per split in the sliced copies


def reference_normalize(line: str) -> str:
    """Independent statement of the rule: NFC, strip, collapse whitespace runs."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", line)).strip()


def raw_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes), to prove nothing changed."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def sliced_corpus(tmp_path, multi30k_dir) -> Path:
    """The first SLICE lines of every en/de split, as plain UTF-8 files (easy to break)."""
    folder = tmp_path / "raw"
    folder.mkdir()
    for split in SPLITS:
        for lang in ("en", "de"):
            lines = raw_lines(multi30k_dir / f"{split}.{lang}.gz")[:SLICE]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def sliced_config(make_config, sliced_corpus, tmp_path):
    def _make(*overrides: str) -> Config:
        return make_config(f"data.raw_dir={sliced_corpus}", "data.download=false", *overrides)

    return _make


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


def test_whitespace_only_lines_are_dropped_and_counted(sliced_config, sliced_corpus):
    path = sliced_corpus / "test_2016_flickr.de"
    lines = path.read_text("utf-8").split("\n")[:-1]
    lines[4] = " \t \u00a0 "
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = sliced_config()
    stats = prepare(cfg)["splits"]["test_2016_flickr"]
    assert stats == stats | {"read": SLICE, "kept": SLICE - 1}
    assert stats["dropped"]["empty"] == 1
    en = Path(cfg.paths.prepared, "test_2016_flickr.en").read_text("utf-8").split("\n")
    raw_en = (sliced_corpus / "test_2016_flickr.en").read_text("utf-8").split("\n")
    assert raw_en[4] not in en and en[4] == raw_en[5]  # alignment kept after the drop


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


def break_missing_file(folder: Path) -> tuple[str, ...]:
    (folder / "test_2016_flickr.de").unlink()
    return "test_2016_flickr.de", RAW_DIR_ENV, "data.download=true"


def break_missing_dir(folder: Path) -> tuple[str, ...]:
    shutil.rmtree(folder)
    return str(folder), "does not exist", RAW_DIR_ENV


BREAKERS = [break_misaligned, break_utf8, break_control_bytes, break_no_letters, break_empty]


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


def test_missing_configured_test_split_names_its_files(sliced_config):
    with pytest.raises(DataError, match=r"test_2017_mscoco\.en, test_2017_mscoco\.de"):
        prepare(sliced_config("data.test_splits=[test_2016_flickr,test_2017_mscoco]"))


# ---- download: file:// URLs to a local copy, SHA-256 checked ---------------------------------


@pytest.fixture
def mirror(tmp_path, multi30k_dir) -> Path:
    """A local 'server' holding the real en/de .gz files (fetched through a file:// URL)."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    for split in SPLITS:
        for lang in ("en", "de"):
            shutil.copy(multi30k_dir / f"{split}.{lang}.gz", folder)
    return folder


def test_download_verifies_and_caches(make_config, mirror, tmp_path):
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={mirror.as_uri()}")
    cache = tmp_path / "cache"
    stats = prepare(cfg, cache_dir=cache)
    assert stats["splits"]["val"]["read"] == 1014
    cached = cache / "multi30k" / "val.de.gz"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == cfg.data.sha256["val.de.gz"]
    # A damaged cached copy is detected and fetched again.
    cached.write_bytes(b"garbage")
    prepare(cfg, cache_dir=cache)
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == cfg.data.sha256["val.de.gz"]


def test_download_checksum_mismatch_names_file_and_hashes(make_config, mirror, tmp_path):
    corrupt = mirror / "val.en.gz"
    corrupt.write_bytes(corrupt.read_bytes()[:-7] + b"\x00" * 7)
    actual = hashlib.sha256(corrupt.read_bytes()).hexdigest()
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={mirror.as_uri()}")
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as err:
        prepare(cfg, cache_dir=cache)
    message = str(err.value)
    assert "val.en.gz" in message and cfg.data.sha256["val.en.gz"] in message and actual in message
    assert not (cache / "multi30k" / "val.en.gz").exists()
    assert not Path(cfg.paths.prepared).exists()


def test_download_of_absent_file_is_a_data_error(make_config, mirror, tmp_path):
    (mirror / "test_2016_flickr.de.gz").unlink()
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={mirror.as_uri()}")
    with pytest.raises(DataError, match=r"test_2016_flickr\.de\.gz.*" + RAW_DIR_ENV):
        prepare(cfg, cache_dir=tmp_path / "cache")


def test_download_without_known_checksum_needs_its_name_in_allow_unverified(
    make_config, mirror, tmp_path
):
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={mirror.as_uri()}",
                      "data.allow_unverified=[test_2016_flickr.de.gz]")  # fmt: skip
    del cfg.data.sha256["test_2016_flickr.de.gz"]
    with pytest.warns(UserWarning, match=r"test_2016_flickr\.de\.gz.*unverified"):
        prepare(cfg, cache_dir=tmp_path / "cache")


# ---- download over HTTP: a real server on this machine, serving tampered files ---------------


class RecordingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves its folder and records every path asked for; `/moved/<name>` redirects to
    `server.moved_to/<name>`."""

    def do_GET(self) -> None:
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", f"{self.server.moved_to}/{self.path.split('/')[-1]}")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's name)
        self.server.requests.append(self.path)


@pytest.fixture
def http_mirror(tmp_path, multi30k_dir):
    """A real HTTP server on every interface serving `folder` (the real en/de/fr .gz files,
    for tests to tamper with); `requests` lists the paths it was asked for."""
    folder = tmp_path / "served"
    folder.mkdir()
    for path in multi30k_dir.glob("*.gz"):
        shutil.copy(path, folder)
    handler = functools.partial(RecordingHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), handler)
    server.requests, server.moved_to = [], ""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield SimpleNamespace(folder=folder, port=server.server_address[1], requests=server.requests,
                          server=server)  # fmt: skip
    server.shutdown()
    server.server_close()


def write_gzip_lines(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in lines))


def previous_output(cfg: Config) -> dict[str, bytes]:
    """A prepared folder from an earlier run, which a refused download must leave as it is."""
    prepared = Path(cfg.paths.prepared)
    prepared.mkdir(parents=True)
    (prepared / "val.en").write_text("an earlier, good preparation\n")
    return snapshot(prepared)


def test_a_language_without_checksums_is_downloaded_only_when_named(
    make_config, http_mirror, tmp_path
):
    """cs has no SHA-256 in conf/data/multi30k.yaml: whatever the server sends is refused
    before the first request, unless data.allow_unverified names each file."""
    for split in SPLITS:  # what the server sends as Czech: anything at all
        english = raw_lines(http_mirror.folder / f"{split}.en.gz")
        write_gzip_lines(http_mirror.folder / f"{split}.cs.gz", [f"x {s}" for s in english])
    url = f"http://127.0.0.1:{http_mirror.port}"
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={url}",
                      "data.tgt_lang=cs")  # fmt: skip
    before = previous_output(cfg)
    with pytest.raises(DataError) as error:
        prepare(cfg, cache_dir=tmp_path / "cache")
    names = [f"{split}.cs.gz" for split in SPLITS]
    assert f"data.allow_unverified=[{','.join(names)}]" in str(error.value)
    assert http_mirror.requests == []  # refused before the first download
    assert snapshot(Path(cfg.paths.prepared)) == before

    cfg.data.allow_unverified = names  # named one by one: accepted, with a warning each
    with pytest.warns(UserWarning, match=r"\.cs\.gz .*unverified") as warned:
        prepare(cfg, cache_dir=tmp_path / "cache")
    assert len([w for w in warned if "unverified" in str(w.message)]) == len(names)
    assert (Path(cfg.paths.prepared) / "train.cs").read_text().startswith("x ")


def test_a_tampered_download_is_refused_and_the_previous_output_kept(
    make_config, http_mirror, tmp_path
):
    tampered = http_mirror.folder / "val.de.gz"
    lines = raw_lines(tampered)
    write_gzip_lines(tampered, [f"{lines[0]} (altered)", *lines[1:]])
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}",
                      f"data.url=http://127.0.0.1:{http_mirror.port}")  # fmt: skip
    before = previous_output(cfg)
    with pytest.raises(
        DataError, match=r"val\.de\.gz \(from http://127\.0\.0\.1:\d+/val\.de\.gz\): SHA"
    ):
        prepare(cfg, cache_dir=tmp_path / "cache")
    assert "/val.de.gz" in http_mirror.requests
    assert snapshot(Path(cfg.paths.prepared)) == before
    assert not (tmp_path / "cache" / "multi30k" / "val.de.gz").exists()


def network_address() -> str:
    """This machine's address on its outgoing network interface (not loopback)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("192.0.2.1", 9))  # UDP: picks the outgoing interface, sends nothing
    address = probe.getsockname()[0]
    probe.close()
    if ipaddress.ip_address(address).is_loopback:
        pytest.skip("this machine has no network interface besides loopback")
    return address


def test_plain_http_is_refused_before_any_request(make_config, http_mirror, tmp_path):
    """The same server, reached over the network instead of the loopback interface."""
    url = f"http://{network_address()}:{http_mirror.port}"
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={url}")
    before = previous_output(cfg)
    with pytest.raises(ConfigError, match=rf"'data\.url': {re.escape(url)} is not an https://"):
        prepare(cfg, cache_dir=tmp_path / "cache")
    assert http_mirror.requests == []
    assert snapshot(Path(cfg.paths.prepared)) == before


def test_a_redirect_to_plain_http_is_refused(make_config, http_mirror, tmp_path):
    http_mirror.server.moved_to = f"http://{network_address()}:{http_mirror.port}"
    cfg = make_config(f"data.raw_dir={tmp_path / 'no_copy'}",
                      f"data.url=http://127.0.0.1:{http_mirror.port}/moved")  # fmt: skip
    before = previous_output(cfg)
    with pytest.raises(ConfigError, match=rf"redirects to {http_mirror.server.moved_to}/"):
        prepare(cfg, cache_dir=tmp_path / "cache")
    assert [path for path in http_mirror.requests if not path.startswith("/moved/")] == []
    assert snapshot(Path(cfg.paths.prepared)) == before


@pytest.mark.parametrize(
    ("url", "allowed"),
    [("https://raw.githubusercontent.com/multi30k/dataset", True), ("file:///srv/multi30k", True),
     ("http://127.0.0.1:8000/raw", True), ("http://localhost/raw", True),
     ("http://[::1]:8000/raw", True), ("http://example.com/raw", False),
     ("http://10.1.2.3/raw", False), ("ftp://example.com/raw", False),
     ("HTTP://example.com/raw", False)],
)  # fmt: skip
def test_download_urls_are_https_a_local_copy_or_this_machine(url, allowed):
    if allowed:
        check_download_url(url)
    else:
        with pytest.raises(ConfigError, match="config key 'data.url'"):
            check_download_url(url)


def test_allow_unverified_names_files(make_config):
    with pytest.raises(ConfigError, match=r"'data\.allow_unverified'.*'\.\./x\.gz'"):
        make_config("data.allow_unverified=[../x.gz]")


# ---- other sources ---------------------------------------------------------------------------


def test_text_source_matches_multi30k_source(sliced_config, sliced_corpus, tmp_path):
    reference = sliced_config()
    prepare(reference)
    files = [  # a user adds the split -> {src, tgt} map on the command line like this
        f"+data.text_files.{split}={{src:'{sliced_corpus / f'{split}.en'}',"
        f"tgt:'{sliced_corpus / f'{split}.de'}'}}"
        for split in SPLITS
    ]
    cfg = sliced_config("data.source=text", *files)
    cfg.paths.prepared = str(tmp_path / "text" / "prepared")
    cfg.paths.metrics_dir = str(tmp_path / "text" / "metrics")
    prepare(cfg)
    assert snapshot(Path(cfg.paths.prepared)) == snapshot(Path(reference.paths.prepared))


def test_hf_source_local_dataset(sliced_config, sliced_corpus, tmp_path):
    reference = sliced_config()
    prepare(reference)
    dataset = tmp_path / "hf_dataset"
    dataset.mkdir()
    card = ["---", "configs:", "- config_name: en-de", "  data_files:"]
    for split in SPLITS:
        en = (sliced_corpus / f"{split}.en").read_text("utf-8").split("\n")[:-1]
        de = (sliced_corpus / f"{split}.de").read_text("utf-8").split("\n")[:-1]
        rows = [json.dumps({"translation": {"en": s, "de": t}}) for s, t in zip(en, de)]
        (dataset / f"{split}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
        card += [f"  - split: {split}", f"    path: {split}.jsonl"]
    (dataset / "README.md").write_text("\n".join([*card, "---", ""]), encoding="utf-8")
    cfg = sliced_config("data.source=hf", f"data.hf_path={dataset}", "data.hf_name=en-de")
    cfg.paths.prepared = str(tmp_path / "hf" / "prepared")
    cfg.paths.metrics_dir = str(tmp_path / "hf" / "metrics")
    prepare(cfg, cache_dir=tmp_path / "cache")
    assert snapshot(Path(cfg.paths.prepared)) == snapshot(Path(reference.paths.prepared))
    with pytest.raises(DataError, match=r"no split\(s\) \['dev'\]"):
        prepare(
            sliced_config(
                "data.source=hf",
                f"data.hf_path={dataset}",
                "data.hf_name=en-de",
                "data.val_split=dev",
            ),
            cache_dir=tmp_path / "cache",
        )


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


def test_atomic_directory_on_a_full_disk_keeps_the_previous_output(tmp_path):
    """ENOSPC while the new output is written (as `datasets` raises it): a DiskFullError that
    says the previous output is intact, which it is; no staging folder is left behind."""
    target = tmp_path / "tokenized"
    with atomic_directory(target) as staging:
        (staging / "spm.model").write_bytes(b"previous")
    with pytest.raises(DiskFullError, match="tokenized: disk full .*; the previous tokenized is"):
        with atomic_directory(target) as staging:
            (staging / "spm.model").write_bytes(b"new, half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert [p.name for p in tmp_path.iterdir()] == ["tokenized"]
    assert (target / "spm.model").read_bytes() == b"previous"
