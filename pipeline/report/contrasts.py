"""The table and findings of the comparisons a spec asks for beside those with the base, and the
heads x width grid.

`contrasts: [[a, b], ...]` in a spec compares variant a with variant b by the same Welch test
over seed-level test BLEU (and val PPL) as every variant's comparison with the base, in the
same Holm family (`rows.holm_family`: every planned comparison, the base's first in the spec's
order, then the contrasts). A contrast is made where both variants ran under one set of run
conditions; one not made stays in the family as p = 1.

Where variants set `model.head_dim`, the report adds a grid of mean test BLEU by number of
heads (rows) and d_k (columns) over the variants that change nothing else (a table here, a
chart in `charts`).
"""

from __future__ import annotations

from pipeline.report.prose import detectable_text
from pipeline.report.rows import CANNOT_TELL, ContrastRow, VariantRow, family_contrasts
from pipeline.report.tables import delta_cell, p_text, verdict_cell
from pipeline.sweep.spec import StudySpec, point_config

# The settings the heads x width grid is drawn over: a variant changing any other is left out
HEAD_KEYS = ("model.heads", "model.head_dim")


def extra_tables(spec: StudySpec, rows: list[VariantRow]) -> list[str]:
    """The report's tables beside the comparisons with the base, where the spec has them: its
    contrasts (adjusted in the one family) and the heads x width grid."""
    contrasts = family_contrasts(spec, rows)
    made = contrasts_table(contrasts)
    findings = contrast_findings(spec, contrasts)
    if findings:
        made += "\n\n" + "\n".join(findings)
    return [table for table in (made, heads_width_table(spec, rows)) if table]


def contrasts_table(contrasts: list[ContrastRow]) -> str:
    """The spec's contrasts: test2016 BLEU (lc) and val PPL differences, Welch and Holm."""
    if not contrasts:
        return ""
    lines = [
        "Contrasts the spec asks for beside the comparisons with the base, in the same Holm "
        "family:",
        "",
        "| contrast | Δ test2016 BLEU (lc) [95% CI] | p (seeds, Welch) | p (Holm) | verdict | "
        "p (seeds, exact permutation) | Δ val PPL | p (Holm, PPL) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in contrasts:
        ppl = "-" if c.ppl_delta is None else f"{c.ppl_delta:+.2f}"
        lines.append(
            f"| {c.label} | {delta_cell(c.delta, c.delta_interval)} | "
            f"{p_text(c.welch_p)} | {p_text(c.holm_p)} | {verdict_cell(c)} | "
            f"{p_text(c.permutation_p)} | {ppl} | "
            f"{p_text(c.ppl_holm_p)} |"
        )
    return "\n".join(lines)


def contrast_findings(spec: StudySpec, contrasts: list[ContrastRow]) -> list[str]:
    """One sentence per contrast made: what it holds apart (where both variants are head
    shapes), the difference with its interval, and its test's verdict or, while planned seeds
    run on, that it is an interim estimate."""
    shapes = head_shapes(spec)
    lines = []
    for c in contrasts:
        if c.delta is None:
            continue
        apart = _held_apart(shapes.get(c.variant), shapes.get(c.other))
        name = f"- {c.label}{f' ({apart})' if apart else ''}"
        if c.no_test_reason:  # other conditions, or no spread: no test, interim or not
            lines.append(f"{name}: {c.delta:+.2f} BLEU: {CANNOT_TELL} (no seed-level test: "
                         f"{c.no_test_reason}).")  # fmt: skip
            continue
        seeds = f"{len(c.row.seeds)} vs {len(c.other_row.seeds)} seeds"
        measured = f"{delta_cell(c.delta, c.delta_interval)} BLEU"
        if c.interim:
            lines.append(f"{name}: interim estimate {measured} ({seeds}): no test until every "
                         "planned seed has finished.")  # fmt: skip
            continue
        detectable = detectable_text(c)
        verdict = f"{c.verdict} ({detectable})" if detectable else c.verdict
        ppl = "" if c.ppl_delta is None else (
            f"; val PPL {c.ppl_delta:+.2f} (Holm p = {p_text(c.ppl_holm_p)})")  # fmt: skip
        lines.append(f"{name}: {measured} ({seeds}; Welch p = {c.welch_p:.3f}, Holm p = "
                     f"{c.holm_p:.3f}; exact permutation p = {c.permutation_p:.3f}): "
                     f"{verdict}{ppl}.")  # fmt: skip
    return lines


def _held_apart(shape: tuple[int, int] | None, other: tuple[int, int] | None) -> str:
    """What a contrast of two head shapes (h, d_k) varies and what it keeps."""
    if shape is None or other is None:
        return ""
    (h, d_k), (other_h, other_d_k) = shape, other
    if h == other_h:
        return f"the same {h} heads, d_k {d_k} against {other_d_k}"
    if d_k == other_d_k:
        return f"the same head width d_k {d_k}, {h} heads against {other_h}"
    return f"{h} heads of d_k {d_k} against {other_h} of d_k {other_d_k}"


def head_shapes(spec: StudySpec) -> dict[str, tuple[int, int]]:
    """(h, d_k) of the base and of each variant that changes only HEAD_KEYS; empty unless some
    variant sets `model.head_dim` (a study of heads alone keeps d_k = d_model / h)."""
    if not any(_setting(key) == "model.head_dim" for v in spec.variants.values() for key in v):
        return {}
    shapes = {}
    for name, overrides in spec.variants.items():
        if all(_setting(key) in HEAD_KEYS for key in overrides):
            model = point_config(spec, overrides).model
            d_k = model.d_model // model.heads if model.head_dim is None else model.head_dim
            shapes[name] = (model.heads, d_k)
    return shapes


def _setting(key: str) -> str:
    return key.lstrip("+~")


def heads_width_grid(
    spec: StudySpec, rows: list[VariantRow]
) -> tuple[list[int], list[int], dict[tuple[int, int], VariantRow]]:
    """The grid's rows (every h the spec plans) and columns (every d_k), ascending, and its
    cells: (h, d_k) -> the row of the variant of that shape, one per variant that changes only
    the heads or their width, run under the base's conditions (none: nothing to draw)."""
    shapes = head_shapes(spec)
    cells = {
        shapes[r.variant]: r
        for r in rows
        if r.variant in shapes and (r.delta is None or r.comparable)
    }
    heads = sorted({h for h, _ in shapes.values()})
    return heads, sorted({d_k for _, d_k in shapes.values()}), cells


def heads_width_table(spec: StudySpec, rows: list[VariantRow]) -> str:
    """Mean test2016 BLEU (lc) over seeds by heads h (rows) and d_k (columns), over every
    shape the spec plans."""
    heads, widths, means = heads_width_grid(spec, rows)
    if not means:
        return ""
    lines = [
        "Heads against their width: mean test2016 BLEU (lc) over seeds (their number), by heads "
        "h and d_k = d_v (the base's width d_model is fixed; h x d_k is the attention's width).",
        "",
        "| h \\ d_k | " + " | ".join(str(d_k) for d_k in widths) + " |",
        "|---|" + "---|" * len(widths),
    ]
    for h in heads:
        cells = []
        for d_k in widths:
            row = means.get((h, d_k))
            cells.append(
                "-" if row is None else f"{row.test_mean:.2f} ({len(row.test_bleu)}, {row.variant})"
            )
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
