"""Crash-safe file writes: every artifact is either its previous version or the new one.

A file is written to a temporary name beside its target (`.<name>.tmp-<pid>`), fsynced and
renamed over it (`os.replace` is atomic on POSIX), so a killed process or a full disk leaves
the old file (or none), never half of one. A full disk raises DiskFullError naming the file.
Temporary files of a process that was killed mid-write are removed by `remove_stale_temps`.
A folder of outputs is built beside its target and swapped in whole (`atomic_directory`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from pipeline.errors import disk_full_error, is_disk_full

_TEMP_NAME = re.compile(r"^\..+\.tmp-(?P<pid>\d+)$")

# tempfile creates private (0700/0600) entries; outputs get the usual umask-based modes.
_UMASK = os.umask(0)
os.umask(_UMASK)


def usual_mode(mode: int) -> int:
    """`mode` less the process's umask: what a plain open() or mkdir() would have made."""
    return mode & ~_UMASK


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call `write(file)` on a temporary binary file beside `path`, fsync it, rename it over
    `path`. A full disk raises DiskFullError naming `path`; the previous file is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        if is_disk_full(err):
            raise disk_full_error(path, previous_existed=path.exists()) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json_atomic(path: str | os.PathLike, payload, **dumps_options) -> None:
    """`payload` as indented JSON (`dumps_options` go to `json.dumps`, e.g. `cls`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, **dumps_options) + "\n")


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
    os.chmod(staging, usual_mode(0o777))
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that writers in `directory` left when they were killed
    (their process is gone); returns what was removed."""
    directory = Path(directory)
    removed = []
    for path in directory.iterdir() if directory.is_dir() else []:
        match = _TEMP_NAME.match(path.name)
        if match and int(match["pid"]) != os.getpid() and not _alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
