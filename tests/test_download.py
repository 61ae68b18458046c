"""Verified downloads (pipeline.data.download) through the prepare stage: file:// and HTTP
mirrors of the real Multi30k files, checksums, unverified files, plain HTTP and redirects."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import ipaddress
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import RAW_DIR_ENV
from pipeline.config_schema import Config
from pipeline.data.download import check_download_url
from pipeline.data.prepared import prepare
from pipeline.errors import ConfigError, DataError
from tests.conftest import SPLITS, raw_lines, run_stage, snapshot, write_params

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


# ---- a server that trickles: an overall deadline and a minimum rate ---------------------------


class TricklingHandler(http.server.BaseHTTPRequestHandler):
    """Announces `server.size` bytes, then sends `server.chunk` of them every `server.every`
    seconds: each read returns in time, so only the download's pace can end it. With
    `server.headers_every`, the status line and headers themselves come a byte at a time."""

    def do_GET(self) -> None:
        try:
            if every := getattr(self.server, "headers_every", None):
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.server.size}\r\n" + "X: " * 200
                for byte in head.encode():
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(every)
            self.send_response(200)
            self.send_header("Content-Length", str(self.server.size))
            self.end_headers()
            for _ in range(0, self.server.size, self.server.chunk):
                self.wfile.write(b"\x1f" * self.server.chunk)
                self.wfile.flush()
                time.sleep(self.server.every)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up
            pass

    def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's name)
        pass


@pytest.fixture
def trickling_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TricklingHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("chunk", "every", "headers_every", "deadline", "bound"),
    # one byte every 0.5 s (the read timeout is 2 s); 4 KiB/s, fast enough, for too long; the
    # headers themselves a byte every 0.5 s (no body read ever starts), ended by the minimum
    # rate after the grace, not by the deadline (900 s by default), or by a deadline before it
    [(1, 0.5, None, 4, "data.limits.download_min_rate_kb_s=1"),
     (4096, 0.5, None, 4, "data.limits.download_deadline_s=4"),
     (4096, 0.5, 0.5, 900, "data.limits.download_min_rate_kb_s=1"),
     (4096, 0.5, 0.5, 1, "data.limits.download_deadline_s=1")],
    ids=["below_min_rate", "past_deadline", "headers_trickle", "headers_past_deadline"],
)  # fmt: skip
def test_a_trickling_server_ends_the_check_stage_with_exit_2_naming_the_url(
    tmp_path, trickling_server, chunk, every, headers_every, deadline, bound
):
    trickling_server.size, trickling_server.chunk, trickling_server.every = 1 << 20, chunk, every
    trickling_server.headers_every = headers_every
    url = f"http://127.0.0.1:{trickling_server.server_address[1]}"
    write_params(tmp_path, f"data.raw_dir={tmp_path / 'no_copy'}", f"data.url={url}",
                 "data.limits.download_read_timeout_s=2", "data.limits.download_grace_s=2",
                 f"data.limits.download_deadline_s={deadline}",
                 "data.limits.download_min_rate_kb_s=1")  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "HOME": str(tmp_path)}  # an empty download cache
    env.pop(RAW_DIR_ENV, None)
    done = run_stage("check", tmp_path, env, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    message = done.stderr.rstrip().splitlines()[-1]  # after the progress bar
    assert message.startswith(f"error: could not download {url}/") and bound in message
    assert "Traceback" not in done.stderr
    assert elapsed < 4 + 2 + 15  # deadline, one read, the stage's start
    assert not list((tmp_path / ".cache").rglob("*.gz"))  # nothing half-fetched kept
