"""The documentation's generated blocks: text between two HTML-comment markers,
`<!-- NAME:begin -->` and `<!-- NAME:end -->`, in README.md or a page of docs/, that one
command rewrites and a test compares with that command's output.

Every producer writes through this module:

| block | page | command |
|---|---|---|
| `results`, `results:headline` | docs/results-runs.md, README.md | `python -m pipeline.results table --update-docs` |
| `ablation:<study>`, `:summary`, `:front` | docs/ablation-<study>.md, README.md, docs/index.md | `python -m pipeline.report <study> --update-docs` |
| `parity`, `parity:comparisons` | docs/parity.md, docs/parity-comparisons.md | `python -m benchmarks.fairseq.parity --update-docs` |
| `gpu` | docs/lab-benchmarks.md | `python -m benchmarks.gpu_report --update-docs` |
| `ci`, `startup` | docs/test-suite.md | `python -m benchmarks.ci_run report --update-docs`, `python -m benchmarks.startup report --update-docs` |
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

from pipeline.errors import DataError

README = Path("README.md")
DOCS = Path("docs")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def _checked(page: Path, name: str) -> str:
    begin, end = markers(name)
    text = page.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise DataError(f"{page}: no '{begin}' ... '{end}' block")
    return text


def fill(page: Path, name: str, block: str) -> None:
    """Replace what lies between the block's markers with `block` (which ends with a newline)."""
    begin, end = markers(name)
    head, rest = _checked(page, name).split(begin, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{begin}\n{block}{end}{tail}", encoding="utf-8")


def read(page: Path, name: str) -> str:
    """What `fill` put between the markers."""
    begin, end = markers(name)
    text = _checked(page, name)
    return text[text.index(begin) + len(begin) + 1 : text.index(end)]


FIGURES = "figures"  # docs/figures/<name>: links to result folders, so the site has their charts


def add_update_argument(parser: argparse.ArgumentParser, pages: str) -> None:
    """`--update-docs [ROOT]`: the producer also writes its blocks into `pages` under ROOT (the
    repository, by default)."""
    parser.add_argument(
        "--update-docs",
        type=Path,
        nargs="?",
        const=Path("."),
        metavar="ROOT",
        help=f"also write the generated blocks into {pages} under ROOT (default: the repository)",
    )


def link_prefix(target: Path, page: Path) -> str:
    """`target` (a folder) as a link from `page`, ending with '/': through the page's
    `figures/<name>` where one links to a folder holding `target` (the documentation site
    holds only what lies under docs/), else relative to the page's folder."""
    folder, target = page.parent, target.resolve()
    figures = folder / FIGURES
    for link in sorted(figures.iterdir()) if figures.is_dir() else []:
        if target == link.resolve() or link.resolve() in target.parents:
            inside = target.relative_to(link.resolve())
            return (Path(FIGURES) / link.name / inside).as_posix() + "/"
    return Path(os.path.relpath(target, folder.resolve())).as_posix() + "/"


def columns(table: str, names: list[str]) -> str:
    """The Markdown table in `table` (its first run of '|' lines) cut down to the columns
    named, in that order: a short view of a generated table for the front page."""
    lines = list(
        itertools.takewhile(
            lambda line: line.startswith("|"),
            itertools.dropwhile(lambda line: not line.startswith("|"), table.splitlines()),
        )
    )
    if len(lines) < 2:
        raise DataError("no Markdown table to take columns from")

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split(" | ")]

    header = cells(lines[0])
    missing = [name for name in names if name not in header]
    if missing:
        raise DataError(f"the table has no column {', '.join(map(repr, missing))}: {header}")
    picked = [header.index(name) for name in names]
    return markdown_table(names, [[row[i] for i in picked] for row in map(cells, lines[2:])])


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of `header` and `rows` (cells already formatted), ending with a newline."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
