"""PNG figures: cross-attention heatmaps, learning curves, ablation bar charts, grids of means.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never through pyplot's
global state, so plotting works headless, in worker processes and in tests alike. Each plot
has a builder returning the Figure (`*_figure`) and a writer saving it as PNG (`plot_*`).
"""

from __future__ import annotations

import csv
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.atomic import atomic_write
from pipeline.metric_names import GREEDY_VAL_BLEU

DPI = 100
PANEL_INCHES_PER_TOKEN = 0.22  # heatmap panels grow with the sentence, so labels stay legible
MIN_PANEL_INCHES = 1.6
CURVE_KEYS = ("train/loss", "val/loss", GREEDY_VAL_BLEU)


def save_png(fig: Figure, path: str | Path) -> Path:
    """Render `fig` with the Agg canvas into a PNG at `path` (parent folders created; written
    atomically, a full disk raises DiskFullError)."""
    FigureCanvasAgg(fig)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    return Path(path)


# --------------------------------------------------------------------------- attention


def _as_array(weights) -> np.ndarray:
    """A float32 numpy array from a torch tensor (any device/dtype) or an array-like."""
    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float32)


def attention_figure(
    weights, src_tokens: Sequence[str], tgt_tokens: Sequence[str], title: str | None = None
) -> Figure:
    """A grid of layers (rows) x heads (columns) of cross-attention maps.

    `weights` (layers, heads, T, S) is `Transformer.cross_attention_weights` for one sentence:
    row t is the distribution over the S source tokens (x axis) while the decoder produces
    target token t (y axis).
    """
    weights = _as_array(weights)
    if weights.ndim != 4:
        raise ValueError(
            f"attention weights must have shape (layers, heads, T, S), got {weights.shape}"
        )
    layers, heads, tgt_len, src_len = weights.shape
    if (tgt_len, src_len) != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(
            f"attention weights are {tgt_len} x {src_len} (target x source) but "
            f"{len(tgt_tokens)} target and {len(src_tokens)} source tokens were given"
        )
    if layers == 0 or heads == 0 or tgt_len == 0 or src_len == 0:
        raise ValueError(f"attention weights are empty: shape {weights.shape}")
    if not np.isfinite(weights).all():
        raise ValueError("attention weights contain NaN or infinity")

    panel_w = max(MIN_PANEL_INCHES, PANEL_INCHES_PER_TOKEN * src_len)
    panel_h = max(MIN_PANEL_INCHES, PANEL_INCHES_PER_TOKEN * tgt_len)
    fig = Figure(figsize=(panel_w * heads + 1.0, panel_h * layers + 0.8), layout="constrained")
    axes = fig.subplots(layers, heads, squeeze=False, sharex=True, sharey=True)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(
                weights[layer, head], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto"
            )
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
            ax.set_xticks(range(src_len), labels=src_tokens, rotation=90, fontsize=7)
            ax.set_yticks(range(tgt_len), labels=tgt_tokens, fontsize=7)
            ax.tick_params(labelbottom=layer == layers - 1, labelleft=head == 0)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_attention(
    weights,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | Path,
    title: str | None = None,
) -> Path:
    """Write one cross-attention heatmap grid (layers x heads) as a PNG."""
    return save_png(attention_figure(weights, src_tokens, tgt_tokens, title), path)


# --------------------------------------------------------------------------- learning curves


def _number(value) -> float:
    """A float from a CSV cell or a logged value; blanks and non-numbers become NaN."""
    if value is None or value == "":
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_history(source: str | Path | Iterable[Mapping]) -> list[dict]:
    """Metric records from a list of dicts or a CSV/TSV file with a `step` column.

    Lightning's CSVLogger and DVCLive write one row per logging event with blank cells for
    metrics not logged at that step; those become NaN and are skipped when plotting.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        delimiter = "\t" if path.suffix == ".tsv" else ","
        with path.open(newline="", encoding="utf-8") as f:
            records = list(csv.DictReader(f, delimiter=delimiter))
        if records and "step" not in records[0]:
            raise ValueError(f"{path}: no 'step' column (columns: {list(records[0])})")
    else:
        records = list(source)
    return [{key: _number(value) for key, value in record.items()} for record in records]


def _series(history: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) where `key` was logged, sorted by step."""
    points = sorted(
        (r["step"], r[key])
        for r in history
        if not math.isnan(r.get(key, math.nan)) and not math.isnan(r.get("step", math.nan))
    )
    steps, values = zip(*points) if points else ((), ())
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def learning_curves_figure(
    history: str | Path | Iterable[Mapping], title: str | None = None
) -> Figure:
    """Losses (train/loss, val/loss) and val/greedy_bleu against the optimizer step, side by side."""
    history = read_history(history)
    series = {key: _series(history, key) for key in CURVE_KEYS}
    if not any(len(steps) for steps, _ in series.values()):
        raise ValueError(f"no {', '.join(CURVE_KEYS)} values with a step in the history")
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, bleu_ax = fig.subplots(1, 2, squeeze=True)
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        steps, values = series[key]
        if len(steps):
            loss_ax.plot(steps, values, style, label=key, markersize=3)
    loss_ax.set(xlabel="step", ylabel="loss (label-smoothed cross-entropy)", title="loss")
    loss_ax.legend()
    steps, values = series[GREEDY_VAL_BLEU]
    bleu_ax.plot(steps, values, "o-", color="tab:green", label=GREEDY_VAL_BLEU, markersize=3)
    bleu_ax.set(xlabel="step", ylabel="BLEU", title=GREEDY_VAL_BLEU)
    for ax in (loss_ax, bleu_ax):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def plot_learning_curves(
    history: str | Path | Iterable[Mapping], path: str | Path, title: str | None = None
) -> Path:
    """Write the learning curves of a metrics history (list of dicts or CSV) as a PNG."""
    return save_png(learning_curves_figure(history, title), path)


# --------------------------------------------------------------------------- bar charts


def bar_chart_figure(
    labels: Sequence[str],
    values: Sequence[float],
    errors: Sequence[float] | None = None,
    *,
    ylabel: str,
    title: str | None = None,
    baseline: float | None = None,
) -> Figure:
    """Bars with symmetric error bars (e.g. BLEU +- 95% CI per ablation variant).

    `baseline` draws a dashed reference line (e.g. the base model's score).
    """
    if len(labels) != len(values) or (errors is not None and len(errors) != len(values)):
        raise ValueError(
            f"{len(labels)} labels, {len(values)} values"
            + (f", {len(errors)} errors" if errors is not None else "")
            + ": give one of each per bar"
        )
    if not labels:
        raise ValueError("no bars to plot")
    fig = Figure(figsize=(max(4.0, 0.7 * len(labels) + 1.5), 4), layout="constrained")
    ax = fig.subplots()
    positions = np.arange(len(labels))
    ax.bar(positions, values, yerr=errors, capsize=4, color="tab:blue", alpha=0.85)
    ax.set_xticks(positions, labels=labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if baseline is not None:
        ax.axhline(baseline, color="tab:red", linestyle="--", linewidth=1, label="baseline")
        ax.legend()
    if title:
        set_wrapped_title(ax, title)
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    errors: Sequence[float] | None,
    path: str | Path,
    *,
    ylabel: str,
    title: str | None = None,
    baseline: float | None = None,
) -> Path:
    """Write a bar chart with error bars as a PNG."""
    fig = bar_chart_figure(labels, values, errors, ylabel=ylabel, title=title, baseline=baseline)
    return save_png(fig, path)


# --------------------------------------------------------------------------- ablation charts


# A seed-points chart's y axis (and a grid's colour scale) spans at least this many units
# (BLEU): a difference of a point or two then looks like one, not like a cliff, whatever the
# spread of the scores
MIN_SPAN = 10.0
HEATMAP_LIGHT_ABOVE = 0.6  # of viridis' range: from there on its colours are light
TITLE_CHARS_PER_INCH = 8  # characters of matplotlib's default title font per inch of figure
TITLE_WIDTH_SHARE = 0.95  # of the figure's width a title may take on one line
COLUMN_MARGIN = 0.7  # x units beside the outer columns: one column stays a column, centred


def seed_points_figure(
    labels: Sequence[str],
    seed_values: Sequence[Sequence[float]],
    half_widths: Sequence[float | None],
    *,
    ylabel: str,
    title: str | None = None,
    baseline: float | None = None,
    notes: Sequence[str] | None = None,
    min_span: float = MIN_SPAN,
) -> Figure:
    """One column per variant: every seed's score as a small point, their mean as a larger one
    with the mean's 95% interval (`half_widths`: over seeds, or the test set's bootstrap). No
    bars: a bar's length measured from a cut axis exaggerates the differences. The y axis spans
    at least `min_span`; `notes` (a verdict, say) are written under each label."""
    if not labels or len(labels) != len(seed_values) or len(labels) != len(half_widths):
        raise ValueError("give one list of seed values and one half-width per label")
    if notes is not None and len(notes) != len(labels):
        raise ValueError(f"give one note per label: {len(labels)} labels, {len(notes)} notes")
    fig = Figure(figsize=(max(4.0, 0.9 * len(labels) + 1.5), 4.6), layout="constrained")
    ax = fig.subplots()
    ends = []
    for position, (values, half_width) in enumerate(zip(seed_values, half_widths)):
        mean = float(np.mean(values))
        offsets = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
        ax.plot(position + np.asarray(offsets), values, "o", color="tab:blue", markersize=4,
                alpha=0.6)  # fmt: skip
        ax.errorbar(position + 0.3, mean, yerr=half_width, fmt="D", color="black", capsize=4,
                    markersize=6, linewidth=1.2)  # fmt: skip
        ends += [*values, mean - (half_width or 0.0), mean + (half_width or 0.0)]
    ticks = labels if notes is None else [f"{label}\n{note}" for label, note in zip(labels, notes)]
    ax.set_xticks(np.arange(len(labels)), labels=ticks, rotation=30, ha="right", fontsize=8)
    low, high = min(ends), max(ends)
    pad = max(0.1 * (high - low), (min_span - (high - low)) / 2, 0.0)
    ax.set_ylim(low - pad, high + pad)
    ax.set_ylabel(ylabel)
    if baseline is not None:
        ax.axhline(baseline, color="tab:red", linestyle="--", linewidth=1, label="base (mean)")
        ax.legend(loc="lower left", fontsize=8)
    ax.set_xlim(-COLUMN_MARGIN, len(labels) - 1 + COLUMN_MARGIN)
    if title:
        set_wrapped_title(ax, title)
    ax.grid(axis="y", alpha=0.3)
    return fig


def set_wrapped_title(ax, title: str) -> None:
    """`title` on one line where it fits the figure's width, else wrapped to it: a narrow figure
    (one variant, a long 'interim, k of n') keeps all of it instead of cutting it at the edges."""
    text = ax.set_title(title)
    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    if text.get_window_extent(renderer).width > ax.figure.bbox.width * TITLE_WIDTH_SHARE:
        width = int(ax.figure.get_figwidth() * TITLE_CHARS_PER_INCH)
        text.set_text(textwrap.fill(title, width=width, break_long_words=False))


def _axes_figure(size: tuple[float, float], what: str, items: Mapping) -> tuple[Figure, object]:
    if not items:
        raise ValueError(f"no {what} to plot")
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.subplots()


def _label_axes(ax, xlabel: str, ylabel: str, title: str | None) -> None:
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if title:
        set_wrapped_title(ax, title)
    ax.grid(alpha=0.3)


def labelled_scatter_figure(
    points: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
) -> Figure:
    """Each label's (x, y) points in one colour, their mean as a cross; a legend names them
    (labels written beside the points pushed the axes aside)."""
    fig, ax = _axes_figure((6.5, 4.5), "points", points)
    for label, pairs in points.items():
        xs, ys = zip(*pairs)
        (dots,) = ax.plot(xs, ys, "o", markersize=6, label=label)
        ax.plot(np.mean(xs), np.mean(ys), "x", markersize=9, color=dots.get_color())
    ax.legend(fontsize=8)
    _label_axes(ax, xlabel, ylabel, title)
    return fig


LINE_STYLES = ("-", "--", ":")


def curves_figure(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
) -> Figure:
    """One line per label: (steps, values); the legend beside the axes, where it hides no
    curve (inside, a study's eleven labels covered the middle of the plot)."""
    fig, ax = _axes_figure((9.0, 4.5), "curves", curves)
    colours = len(matplotlib.rcParams["axes.prop_cycle"].by_key()["color"])
    for index, (label, (steps, values)) in enumerate(curves.items()):
        # past the colour cycle's colours a new line style keeps every curve apart
        style = LINE_STYLES[index // colours % len(LINE_STYLES)]
        ax.plot(steps, values, style, linewidth=1.3, label=label)
    fig.legend(loc="outside right upper", fontsize=7)
    _label_axes(ax, xlabel, ylabel, title)
    return fig


def grid_heatmap_figure(
    cells: Mapping[tuple[object, object], tuple[float, str]],
    *,
    row_labels: Sequence[object],
    column_labels: Sequence[object],
    xlabel: str,
    ylabel: str,
    colorbar_label: str,
    title: str | None = None,
    min_span: float = MIN_SPAN,
) -> Figure:
    """One value per (row, column) cell as a colour with its text written in the cell; a cell
    without a value stays blank ('-'). Rows run top to bottom in the order given. The colour
    scale spans at least `min_span` around the values' middle: a scale from the smallest to
    the largest value would paint a difference within the noise as the whole range."""
    if not cells:
        raise ValueError("no cells to plot")
    unknown = [key for key in cells if key[0] not in row_labels or key[1] not in column_labels]
    if unknown:
        raise ValueError(f"cells outside the given rows and columns: {unknown}")
    values = np.full((len(row_labels), len(column_labels)), np.nan)
    for (row, column), (value, _) in cells.items():
        values[list(row_labels).index(row), list(column_labels).index(column)] = value
    low, high = np.nanmin(values), np.nanmax(values)
    middle, half_span = (low + high) / 2, max(high - low, min_span) / 2
    fig = Figure(figsize=(1.9 * len(column_labels) + 2.2, 1.0 * len(row_labels) + 1.6),
                 layout="constrained")  # fmt: skip
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto",
                      vmin=middle - half_span, vmax=middle + half_span)  # fmt: skip
    for i, row in enumerate(row_labels):
        for j, column in enumerate(column_labels):
            value, text = cells.get((row, column), (math.nan, "-"))
            # dark text on the colour map's light end and on a blank cell, light on its dark end
            light = math.isnan(value) or image.norm(value) > HEATMAP_LIGHT_ABOVE
            ax.text(j, i, text, ha="center", va="center", fontsize=8,
                    color="black" if light else "white")  # fmt: skip
    ax.set_facecolor("whitesmoke")
    ax.set_xticks(range(len(column_labels)), labels=[str(c) for c in column_labels])
    ax.set_yticks(range(len(row_labels)), labels=[str(r) for r in row_labels])
    ax.set(xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    if title:
        set_wrapped_title(ax, title)
    return fig
