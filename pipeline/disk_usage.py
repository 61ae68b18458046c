"""How much a folder holds, said in a line: the message a run or a sweep prints when what it
moved aside grows (`python -m pipeline.clean` removes it). Apart from pipeline.clean so that
training imports no sweep code."""

from __future__ import annotations

import os
from pathlib import Path


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def leftovers_message(folders: list[Path]) -> str:
    """One line on how much the given folders hold, and how to clean them."""
    total = sum(folder_size(p) for p in folders if p.is_dir())
    return (f"{human_size(total)} in {', '.join(map(str, folders))}; `python -m pipeline.clean` "
            "lists what may go, `--yes` removes it")  # fmt: skip
