"""The report on the docs site and README: the study's generated block on its own page,
docs/ablation-<study>.md (docs/ablation-results.md lists the studies' pages), README's summary
of its main columns and its result on the docs' front page."""

from __future__ import annotations

from pathlib import Path

from pipeline import docs_blocks
from pipeline.errors import DataError
from pipeline.report.document import markdown
from pipeline.report.progress import study_pin
from pipeline.report.prose import summary
from pipeline.report.records import load_records, test_references
from pipeline.report.rows import factor_text, variant_rows
from pipeline.report.tables import grid_table, paper_cell
from pipeline.sweep.spec import STUDY_DB, StudySpec

FRONT_PAGE = "index.md"  # in docs/: a study's result and chart where its block's markers are
# README's summary of a study: these columns of the page's table
SUMMARY_COLUMNS = ["variant", "changed", "seeds", "test2016 BLEU (lc), mean [95% CI]",
                   "Δ test vs base [95% CI]", "p (Holm)", "verdict",
                   "paper, Table 3: Δ BLEU (PPL)"]  # fmt: skip
# The grid table's columns the summary keeps (its "seeds" is the count of the spec's seeds)
_GRID_COLUMNS = [name for name in SUMMARY_COLUMNS if name != "seeds"]


def block_name(study: str) -> str:
    return f"ablation:{study}"


def study_page(study: str) -> Path:
    """The study's page of docs/, around its generated block: one page a study keeps every
    page of the site short."""
    return docs_blocks.DOCS / f"ablation-{study}.md"


def not_started(study_dir: Path) -> bool:
    """Whether no worker has begun the study: no storage (so no pin) and no finished trial
    (the records are read only where the storage is missing)."""
    return not (study_dir / STUDY_DB).exists() and not load_records(study_dir)


def not_started_text(spec: StudySpec) -> str:
    """Where a study no worker has begun stands: what its first worker does."""
    return (
        f"Study `{spec.study}`: not started, 0 of {len(spec.grid())} trials finished. Its first "
        "worker creates the study and pins it to that worker's commit, hardware class and "
        f"precision, which every later trial must share; budget {factor_text(spec.budget)}.\n"
    )


def docs_block(
    spec: StudySpec,
    study_dir: Path,
    page: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> str:
    """The generated text between the page's markers for this study (charts linked from it)."""
    if not_started(study_dir):
        return not_started_text(spec)
    # With the committed storage's trial states: its failed attempts are part of the record
    # (regenerate once the workers have stopped: the states change while they run).
    prefix = docs_blocks.link_prefix(study_dir, page)
    return lead_with_result(markdown(spec, study_dir, image_prefix=prefix, transfer=transfer))


RESULT_FIRST = ("Study ", "**Progress**", "**In short**")  # paragraphs that open the block


def lead_with_result(text: str) -> str:
    """The report's paragraphs in the order a reader of the page wants them: where the study
    stands and what it found (RESULT_FIRST), then its charts, then the tables and the rest."""
    paragraphs = text.rstrip("\n").split("\n\n")
    figures = [line for part in paragraphs for line in part.splitlines() if line.startswith("![")]
    rest = [
        "\n".join(line for line in part.splitlines() if not line.startswith("!["))
        for part in paragraphs
    ]
    rest = [part for part in rest if part]
    first = [part for part in rest if part.startswith(RESULT_FIRST)]
    ordered = (
        first + (["\n".join(figures)] if figures else []) + [p for p in rest if p not in first]
    )
    return "\n\n".join(ordered) + "\n"


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
            paper = paper_cell(spec.paper.get(variant, {}))
            lines.append(f"| {variant} | {factor_text(overrides)} | {done} | - | - | - | - | "
                         f"{paper} |")  # fmt: skip
            continue
        first, rest = cells[variant].split(" | ", 2)[:2], cells[variant].split(" | ", 2)[2]
        lines.append(" | ".join([*first, done, rest]))
    head = _pin_progress(spec, records, pinned)
    return (f"{head}\n\n" if head else "") + "\n".join(lines) + "\n"


def progress_block(spec: StudySpec, study_dir: Path) -> str:
    """README's line for a study whose page holds its tables: how many trials have finished
    (at the pin, for a pinned study) and, once every planned trial has, its verdicts in one
    sentence (the page's **In short**)."""
    if not_started(study_dir):
        return f"0 of {len(spec.grid())} trials finished: not started; its first worker pins it.\n"
    records = load_records(study_dir)
    pinned = study_pin(spec, study_dir)
    head = _pin_progress(spec, records, pinned)
    head = head or f"{len(records)} of {len(spec.grid())} trials finished."
    if _finished(records, pinned) < len(spec.grid()):
        return head + "\n"
    rows = variant_rows(spec, records, test_references(spec), pinned)
    return f"{head}\n\n{summary(rows, spec)}\n"


def _finished(records, pinned) -> int:
    """The trials finished: at the pin, for a pinned study."""
    return len(records) if pinned is None else sum(r.conditions == pinned for r in records)


def _pin_progress(spec: StudySpec, records, pinned) -> str:
    """`25 of 55 trials finished at the study's pin: interim ...`; empty for an unpinned study."""
    if pinned is None:
        return ""
    finished = _finished(records, pinned)
    return f"{finished} of {len(spec.grid())} trials finished at the study's pin" + (
        ": interim estimates, no verdict until all have."
        if finished < len(spec.grid()) else "."
    )  # fmt: skip


def front_block(spec: StudySpec, study_dir: Path, page: Path) -> str:
    """The docs' front page's view of the study: where it stands, its result in short, its
    chart of BLEU per variant, and where the rest is."""
    text = docs_block(spec, study_dir, page)
    parts = text.split("\n\n")
    short = [part for part in parts if part.startswith("**In short**")]
    chart = [line for line in text.splitlines() if line.startswith("![")][:1]
    head = _pin_progress(spec, load_records(study_dir), study_pin(spec, study_dir))
    where = (
        "The tables, every variant's seeds and the tests: "
        f"[Table 3 ablations]({study_page(spec.study).name})."
    )
    return "\n\n".join([*filter(None, [head]), *short, *chart, where]) + "\n"


def update_docs(
    spec: StudySpec,
    study_dir: Path,
    root: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> list[Path]:
    """The study's block on its page `root`/docs/ablation-<study>.md, its summary (or its
    progress line) in `root`/README.md and its result on the docs' front page where they have a
    block for it; returns the files it filled."""
    page = root / study_page(spec.study)
    if not page.is_file():
        begin, end = docs_blocks.markers(block_name(spec.study))
        raise DataError(
            f"{page}: study {spec.study!r} has no page: write it with its '{begin}' ... '{end}' "
            f"block and list it in mkdocs.yml's nav"
        )
    docs_blocks.fill(page, block_name(spec.study), docs_block(spec, study_dir, page, transfer))
    written = [page]
    front = root / docs_blocks.DOCS / FRONT_PAGE
    for target, name, block in (
        (root / docs_blocks.README, "summary", lambda: summary_block(spec, study_dir, page)),
        (root / docs_blocks.README, "progress", lambda: progress_block(spec, study_dir)),
        (front, "front", lambda: front_block(spec, study_dir, front)),
    ):
        name = f"{block_name(spec.study)}:{name}"
        if target.is_file() and docs_blocks.markers(name)[0] in target.read_text(encoding="utf-8"):
            docs_blocks.fill(target, name, block())
            written.append(target)
    return written
