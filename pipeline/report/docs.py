"""The report on the docs site and README: the study's generated block in
docs/ablation-results.md and README's summary of its main columns."""

from __future__ import annotations

from pathlib import Path

from pipeline import docs_blocks
from pipeline.report.document import markdown
from pipeline.sweep.spec import StudySpec

PAGE = docs_blocks.DOCS / "ablation-results.md"
# README's summary of a study: these columns of the page's table
SUMMARY_COLUMNS = ["variant", "changed", "test2016 BLEU (lc), mean [95% CI]", "Δ test vs base",
                   "p (Holm)", "verdict", "paper, Table 3: Δ BLEU (PPL)"]  # fmt: skip


def block_name(study: str) -> str:
    return f"ablation:{study}"


def docs_block(
    spec: StudySpec,
    study_dir: Path,
    page: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> str:
    """The generated text between the page's markers for this study (charts linked from it)."""
    # Without the storage's trial states, which change while workers run.
    prefix = docs_blocks.link_prefix(study_dir, page)
    return markdown(spec, study_dir, image_prefix=prefix, with_states=False, transfer=transfer)


def summary_block(spec: StudySpec, study_dir: Path, page: Path) -> str:
    """README's short view of the study: the main columns of the page's table."""
    return docs_blocks.columns(docs_block(spec, study_dir, page), SUMMARY_COLUMNS)


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
