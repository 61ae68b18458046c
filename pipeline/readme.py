"""README's generated blocks: text between two HTML-comment markers that a command rewrites
(`python -m pipeline.report`, `python -m benchmarks.parity`) and a test compares."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import DataError


def _checked(readme: Path, begin: str, end: str) -> str:
    text = readme.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise DataError(f"{readme}: no '{begin}' ... '{end}' block")
    return text


def fill(readme: Path, begin: str, end: str, block: str) -> None:
    """Replace what lies between the markers with `block` (which ends with a newline)."""
    head, rest = _checked(readme, begin, end).split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{block}{end}{tail}", encoding="utf-8")


def read(readme: Path, begin: str, end: str) -> str:
    """What `fill` put between the markers."""
    text = _checked(readme, begin, end)
    return text[text.index(begin) + len(begin) + 1 : text.index(end)]
