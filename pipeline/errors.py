"""One error type for everything a user can cause: bad data, bad config, missing paths.

The CLIs print the message without a traceback (see `pipeline.cli.main`), so the
message itself must name the file, line or key, and say what to do about it.
"""

import errno
from pathlib import Path


class PipelineError(Exception):
    """A problem the user can fix; the message names the file/line/key and the fix."""

    exit_code = 2  # what a CLI exits with (`pipeline.cli.main`)


class ConfigError(PipelineError):
    """An unknown, ill-typed or impossible configuration value; `key`: the dotted key it
    names, where it names one."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class DataError(PipelineError):
    """A corpus or artifact that is missing, misaligned, empty or corrupt."""


class Preempted(PipelineError):
    """Training stopped on a preemption signal after saving a checkpoint; running the same
    command again resumes from it (see `pipeline.training.preemption`)."""

    exit_code = 3


class WriteError(PipelineError):
    """An artifact could not be written (read-only or forbidden place); written atomically,
    the previous one is kept. `path`: the file."""

    path: Path | None = None


class DiskFullError(WriteError):
    """No space left while writing an artifact; written atomically, the previous one is kept."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# EBUSY: a read-only mount point, which cannot be renamed or replaced
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.EBUSY)


def _os_error(err: BaseException | None, errnos: tuple[int, ...]) -> OSError | None:
    """The OSError with one of `errnos` that `err` is, or was raised from or while handling."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in errnos:
            return err
        err = err.__cause__ or err.__context__
    return None


def is_disk_full(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from or while handling, is ENOSPC/EDQUOT
    (libraries wrap it: torch.save raises a RuntimeError during the failed write's OSError)."""
    return _os_error(err, _DISK_FULL) is not None


def what_was_kept(path: Path, previous_existed: bool) -> str:
    """What a failed atomic write of `path` left: the previous file, or nothing."""
    return f"the previous {path.name} is intact" if previous_existed else "nothing was written"


def disk_full_error(path, previous_existed: bool) -> DiskFullError:
    """The error for an atomic write of `path` that ran out of space (nothing was replaced)."""
    path = Path(path)
    error = DiskFullError(
        f"{path}: disk full (no space left on device) while writing it; "
        f"{what_was_kept(path, previous_existed)}. Free space on that disk (`df -h {path.parent}`) or "
        "point paths.* elsewhere, then run again."
    )
    error.path = path
    return error


def write_error(path, err: BaseException, previous_existed: bool) -> WriteError | None:
    """The error for an atomic write of `path` that failed with `err`: a DiskFullError for a
    full disk, a WriteError for a read-only or forbidden place; None for anything else."""
    if is_disk_full(err):
        return disk_full_error(path, previous_existed)
    denied = _os_error(err, _UNWRITABLE)
    if denied is None:
        return None
    path = Path(path)
    error = WriteError(
        f"{path}: cannot write it ({denied.strerror or 'permission denied'}); "
        f"{what_was_kept(path, previous_existed)}. Make {path.parent} writable or point paths.* "
        "elsewhere, then run again."
    )
    error.path = path
    return error


def not_a_file(path: str | Path) -> str | None:
    """Why `path` cannot be read as a file, to follow its name (`not found`, `is a folder, not a
    file`, ...); None when it is a file."""
    path = Path(path)
    try:
        if path.is_file():
            return None
        if path.is_dir():
            return "is a folder, not a file"
        path.stat()
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if err.errno != errno.ENOENT:
            return f"is unreadable ({err.strerror})"
        return "not found"
    return "is not a regular file"
