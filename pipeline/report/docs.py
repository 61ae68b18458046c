"""The report on the docs site and README: the study's generated block in
docs/ablation-results.md and README's summary of its main columns."""

from __future__ import annotations

from pathlib import Path

from pipeline import docs_blocks
from pipeline.report.document import markdown
from pipeline.report.progress import study_pin
from pipeline.report.records import load_records, test_references
from pipeline.report.rows import factor_text, variant_rows
from pipeline.report.tables import _paper_cell, grid_table
from pipeline.sweep.spec import StudySpec

PAGE = docs_blocks.DOCS / "ablation-results.md"
# README's summary of a study: these columns of the page's table
SUMMARY_COLUMNS = ["variant", "changed", "seeds", "test2016 BLEU (lc), mean [95% CI]",
                   "Δ test vs base [95% CI]", "p (Holm)", "verdict",
                   "paper, Table 3: Δ BLEU (PPL)"]  # fmt: skip
# The grid table's columns the summary keeps (its "seeds" is the count of the spec's seeds)
_GRID_COLUMNS = [name for name in SUMMARY_COLUMNS if name != "seeds"]


def block_name(study: str) -> str:
    return f"ablation:{study}"


def docs_block(
    spec: StudySpec,
    study_dir: Path,
    page: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> str:
    """The generated text between the page's markers for this study (charts linked from it)."""
    # With the committed storage's trial states: its failed attempts are part of the record
    # (regenerate once the workers have stopped: the states change while they run).
    prefix = docs_blocks.link_prefix(study_dir, page)
    return markdown(spec, study_dir, image_prefix=prefix, transfer=transfer)


def summary_block(spec: StudySpec, study_dir: Path, page: Path) -> str:
    """README's short view of the study: every variant of the spec (one not run yet too) with
    the main columns of the page's table and how many of its seeds have finished; for a pinned
    study still running, how many of its trials are done first."""
    records = load_records(study_dir)
    pinned = study_pin(spec, study_dir)
    rows = variant_rows(spec, records, test_references(spec), pinned)
    compared = {r.variant: r for r in rows if r.delta is None or r.comparable}
    picked = docs_blocks.columns(grid_table(rows), _GRID_COLUMNS).splitlines()[2:]
    cells = {line.split(" | ")[0].lstrip("| "): line for line in picked}
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for variant, overrides in spec.variants.items():
        row = compared.get(variant)
        done = f"{len(row.seeds) if row else 0} of {len(spec.seeds)}"
        if row is None:
            paper = _paper_cell(spec.paper.get(variant, {}))
            lines.append(f"| {variant} | {factor_text(overrides)} | {done} | - | - | - | - | "
                         f"{paper} |")  # fmt: skip
            continue
        first, rest = cells[variant].split(" | ", 2)[:2], cells[variant].split(" | ", 2)[2]
        lines.append(" | ".join([*first, done, rest]))
    head = ""
    if pinned is not None:
        finished = sum(r.conditions == pinned for r in records)
        head = f"{finished} of {len(spec.grid())} trials finished at the study's pin"
        head += (": interim estimates, no verdict until all have.\n\n"
                 if finished < len(spec.grid()) else ".\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def update_docs(
    spec: StudySpec,
    study_dir: Path,
    root: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> None:
    """The study's block in `root`/docs/ablation-results.md, and its summary in `root`/README.md
    where README has a block for it."""
    page = root / PAGE
    docs_blocks.fill(page, block_name(spec.study), docs_block(spec, study_dir, page, transfer))
    readme, summary = root / docs_blocks.README, f"{block_name(spec.study)}:summary"
    if docs_blocks.markers(summary)[0] in readme.read_text(encoding="utf-8"):
        docs_blocks.fill(readme, summary, summary_block(spec, study_dir, page))
