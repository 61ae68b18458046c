"""Crash-safe file writes: every artifact is either its previous version or the new one.

A file is written to a temporary name beside its target (`.<name>.tmp-<pid>`), fsynced and
renamed over it (`os.replace` is atomic on POSIX), so a killed process or a full disk leaves
the old file (or none), never half of one. A full disk raises DiskFullError naming the file, a
read-only or forbidden place a WriteError naming it (both exit 2).
Temporary files of a process that was killed mid-write are removed by `remove_stale_temps`.
A folder of outputs is built beside its target and swapped in whole (`atomic_directory`); the
staging folders a killed process left beside it are removed by the next swap of that target
(`stale_staging` finds them: a live writer holds a lock on its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from pipeline.errors import DataError, DiskFullError, WriteError, what_was_kept, write_error

_TEMP_NAME = re.compile(r"^\..+\.tmp-(?P<pid>\d+)$")
WRITE_ATTEMPTS = 2  # a write whose temporary file vanished is made once more

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
    `path`. A full disk raises DiskFullError naming `path`, a read-only or forbidden place a
    WriteError; the previous file is left as it was. A temporary file or folder another
    process removed meanwhile (DVC checks a stage's output folder out under a running stage)
    is written once more before that is an error."""
    path = Path(path)
    for attempt in range(WRITE_ATTEMPTS):
        try:
            _write_and_rename(path, write)
            return
        except FileNotFoundError:
            if attempt + 1 == WRITE_ATTEMPTS:
                raise


def _write_and_rename(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        failed = _write_error(path, err, previous_existed=path.exists())
        if failed is not None:
            raise failed from err
        raise
    finally:
        with contextlib.suppress(OSError):  # nothing to remove on a read-only place
            tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def read_only_mount(path: str | os.PathLike) -> Path | None:
    """The folder at the top of the read-only file system that `path` lies (or would lie) on,
    up to its mount point, as `path` names it; None where that file system is writable."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not os.statvfs(existing).f_flag & os.ST_RDONLY:
        return None
    top = existing
    while (not os.path.ismount(top) and top.parent != top
           and os.statvfs(top.parent).f_flag & os.ST_RDONLY):  # fmt: skip
        top = top.parent
    return top


def _write_error(path: Path, err: BaseException, previous_existed: bool) -> WriteError | None:
    """`write_error`, naming the read-only folder where a read-only mount refused the write
    (a mount point cannot be renamed either: replacing it fails as 'busy' in its parent)."""
    failed = write_error(path, err, previous_existed)
    folder = None if isinstance(failed, DiskFullError) or failed is None else read_only_mount(path)
    if folder is None:
        return failed
    error = WriteError(
        f"{path}: cannot write it: {folder} is on a read-only file system (mounted read-only); "
        f"{what_was_kept(Path(path), previous_existed)}. Mount {folder} read-write or point paths.* "
        "elsewhere, then run again."
    )
    error.path = Path(path)
    return error


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json_atomic(path: str | os.PathLike, payload, **dumps_options) -> None:
    """`payload` as indented JSON (`dumps_options` go to `json.dumps`, e.g. `cls`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, **dumps_options) + "\n")


_STAGING_KINDS = ("tmp", "old")  # the new output being built; the previous one being deleted


def _staging_folder(target: Path, kind: str) -> tuple[Path, int]:
    """A new folder `.<target>.<kind>-<pid>-<random>` beside `target` and an open handle on it
    that holds an exclusive lock for as long as this process owns it."""
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-{os.getpid()}-",
                                   dir=target.parent))  # fmt: skip
    handle = os.open(folder, os.O_RDONLY)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return folder, handle


def _owned(folder: Path) -> bool:
    """Whether a live process still builds or deletes `folder`: its lock is held, or the
    process its name records runs (it may not have taken the lock yet)."""
    match = re.match(r"^\.\S+?\.(?:tmp|old)-(?P<pid>\d+)-", folder.name)
    if match and int(match["pid"]) != os.getpid() and _alive(int(match["pid"])):
        return True
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
    return False


def stale_staging(target: str | os.PathLike) -> list[Path]:
    """The staging folders beside `target` that a killed `atomic_directory` left (also those of
    earlier versions, named `.<target>.tmp-<random>`): no live process owns them."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    prefixes = tuple(f".{target.name}.{kind}-" for kind in _STAGING_KINDS)
    return sorted(
        path for path in target.parent.iterdir()
        if path.name.startswith(prefixes) and path.is_dir() and not path.is_symlink()
        and not _owned(path)
    )  # fmt: skip


def _failed_file(err: BaseException, staging: Path, target: Path) -> Path:
    """The output file a failure inside `staging` was writing, as it is named in `target`."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        name = getattr(err, "path", None) or getattr(err, "filename", None)
        if name:
            with contextlib.suppress(ValueError):
                return target / Path(name).relative_to(staging)
        err = err.__cause__ or err.__context__
    return target


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def refuse_replacing(
    target: str | os.PathLike, keep: Mapping[str, str | os.PathLike], name: str | None = None
) -> None:
    """Refuse to replace the folder `target` (called `name`) where that would delete or change
    something in `keep` ({what it is: path}: the command's inputs, other stages' outputs): a
    DataError naming both, when `target` is one of them, holds one or lies inside one."""
    target = Path(target)
    name = f"{name} {target}" if name else str(target)
    resolved = target.resolve()
    for label, path in keep.items():
        kept = Path(path).resolve()
        if _within(kept, resolved):
            raise DataError(
                f"{name} holds {label} {path}: replacing that folder would delete it; "
                "write to another folder"
            )
        if _within(resolved, kept):
            raise DataError(
                f"{name} lies inside {label} {path}: replacing it would change that "
                "output; write to another folder"
            )


@contextlib.contextmanager
def atomic_directory(
    target: str | os.PathLike, keep: Mapping[str, str | os.PathLike] | None = None
) -> Iterator[Path]:
    """Yield an empty temp folder beside `target`; on success it replaces `target`.

    On an exception the temp folder is removed and `target` (a previous good output) is left
    untouched; a full disk is a DiskFullError, a read-only place a WriteError, naming the file.
    The swap is two renames on one filesystem: the old output moves aside, the new one takes
    its name, then the old one is deleted. Staging folders that a killed run left beside
    `target` are removed first. A `target` that holds, is, or lies inside something in
    `keep` is refused before anything is written (`refuse_replacing`).
    """
    target = Path(target)
    refuse_replacing(target, keep or {})
    staging = handle = previous = previous_handle = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in stale_staging(target):
            shutil.rmtree(stale, ignore_errors=True)
        staging, handle = _staging_folder(target, "tmp")
        os.chmod(staging, usual_mode(0o777))
        yield staging
        if target.exists():  # (a new folder: may also find the disk full)
            previous, previous_handle = _staging_folder(target, "old")
    except BaseException as err:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            os.close(handle)
        if isinstance(err, Exception):
            path = target if staging is None else _failed_file(err, staging, target)
            failed = _write_error(path, err, previous_existed=path.exists())
            if failed is not None:
                raise failed from err
        raise
    try:
        _swap(target, staging, previous)
    except OSError as err:
        for folder in (staging, previous):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        failed = _write_error(target, err, previous_existed=target.exists())
        if failed is not None:
            raise failed from err
        raise
    finally:  # the locks go once nothing is left to swap
        os.close(handle)
        if previous_handle is not None:
            os.close(previous_handle)


def _swap(target: Path, staging: Path, previous: Path | None) -> None:
    """`staging` takes `target`'s name; the previous `target` moves into `previous` and is
    deleted, or moves back where the new one cannot take its place (a read-only mount)."""
    if previous is not None:
        os.replace(target, previous / target.name)
    try:
        os.replace(staging, target)
    except OSError:
        if previous is not None:
            os.replace(previous / target.name, target)
        raise
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
