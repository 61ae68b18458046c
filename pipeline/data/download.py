"""Verified downloads: only from a URL no network can alter (https://, a local file:// copy, or
http:// to this machine's loopback), redirects included, and only files whose SHA-256 is known
(`data.sha256`) unless `data.allow_unverified` names them; each is fetched atomically and its
SHA-256 checked before it takes its name."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline import console
from pipeline.atomic import usual_mode
from pipeline.config import RAW_DIR_ENV
from pipeline.config_schema import DataConfig, LimitsConfig
from pipeline.errors import ConfigError, DataError

_READ_BLOCK = 1 << 16


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


class _TooSlow(OSError):
    """A download past its deadline or below its minimum rate (reported as any failed one)."""


def _check_pace(received: int, started: float, limits: LimitsConfig) -> None:
    """Refuse a download past `data.limits.download_deadline_s`, or slower on average than
    `download_min_rate_kb_s` once `download_grace_s` has passed: a server that trickles a byte
    now and then never trips the per-read timeout."""
    elapsed = time.monotonic() - started
    if elapsed > limits.download_deadline_s:
        raise _TooSlow(
            f"not done after {elapsed:.0f} s, the bound data.limits.download_deadline_s="
            f"{limits.download_deadline_s:g} ({received} bytes received)"
        )
    rate = received / 1024 / elapsed if elapsed > 0 else float("inf")
    if elapsed > limits.download_grace_s and rate < limits.download_min_rate_kb_s:
        raise _TooSlow(
            f"{rate:.2f} KiB/s over {elapsed:.0f} s, below data.limits.download_min_rate_kb_s="
            f"{limits.download_min_rate_kb_s:g}"
        )


@contextlib.contextmanager
def _alarm(at: float, started: float, message: Callable[[], str]):
    """Raise `_TooSlow(message())` where the download waits when `at` seconds have passed since
    `started`, whatever it waits on: a server that sends its headers a byte at a time keeps
    every read in time and never reaches the body's pace checks. A SIGALRM timer, so only on
    the main thread (elsewhere the per-read timeout and the body's checks remain); an
    enclosing alarm goes on afterwards where it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _TooSlow(message())

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, max(at - (time.monotonic() - started), 1e-3))
    set_at = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - set_at), 1e-3))


def _wall_clock_deadline(seconds: float, started: float):
    return _alarm(seconds, started, lambda: (
        f"not done after {time.monotonic() - started:.0f} s, the bound "
        f"data.limits.download_deadline_s={seconds:g}"))  # fmt: skip


def _headers_pace(limits: LimitsConfig, started: float):
    """The minimum rate applied to the response's headers: a few hundred bytes, which any
    server keeping `download_min_rate_kb_s` has sent when `download_grace_s` ends."""
    if not limits.download_min_rate_kb_s or limits.download_grace_s >= limits.download_deadline_s:
        return contextlib.nullcontext()
    return _alarm(limits.download_grace_s, started, lambda: (
        f"no complete response headers after {time.monotonic() - started:.0f} s "
        f"(data.limits.download_grace_s={limits.download_grace_s:g}): below "
        f"data.limits.download_min_rate_kb_s={limits.download_min_rate_kb_s:g}"))  # fmt: skip


def download_file(
    url: str, dest: Path, expected_sha256: str | None, limits: LimitsConfig | None = None
) -> Path:
    """Fetch `url` into `dest` (atomically, with a progress bar) and verify its SHA-256; a
    download past `limits` (deadline, minimum rate, one read's timeout) is a DataError."""
    limits = limits or LimitsConfig()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.chmod(part, usual_mode(0o666))
    # No single read may wait past the deadline either.
    timeout = min(limits.download_read_timeout_s, limits.download_deadline_s)
    try:
        started = time.monotonic()
        with _wall_clock_deadline(limits.download_deadline_s, started), os.fdopen(fd, "wb") as out:
            with _headers_pace(limits, started):
                response = _OPENER.open(url, timeout=timeout)
            with response:
                total = response.headers.get("Content-Length")
                # read1: what has arrived, so a trickling server's pace is seen at each read
                read = getattr(response, "read1", response.read)
                with console.Phase(
                    f"download {dest.name}",
                    total=int(total) if total else None,
                    unit="B",
                    unit_scale=True,
                ) as bar:
                    received = 0
                    while block := read(_READ_BLOCK):
                        out.write(block)
                        bar.update(len(block))
                        received += len(block)
                        _check_pace(received, started, limits)
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
