"""Figures are real PNGs of the expected size, and each panel shows the data it claims to."""

from __future__ import annotations

import csv
import math

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from pipeline.evaluation import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0.01  # something was drawn
    return image


def figure_pixels(fig) -> tuple[int, int]:
    width, height = fig.get_size_inches()
    return round(height * plots.DPI), round(width * plots.DPI)


def heatmap_axes(fig):
    """The panels that carry a heatmap (the colorbar axes carry none)."""
    return [ax for ax in fig.axes if ax.images]


def random_attention(layers, heads, tgt_len, src_len, seed=0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, tgt_len, src_len, generator=generator)
    return scores.softmax(dim=-1)


def test_attention_heatmap_grid_is_layers_by_heads(tmp_path):
    layers, heads, src, tgt = 3, 4, ["A", "man", "is", "sleeping", "."], ["Ein", "Mann", "schläft"]
    weights = random_attention(layers, heads, len(tgt), len(src))

    fig = plots.attention_figure(weights, src, tgt, title="example 0")
    panels = heatmap_axes(fig)
    assert len(panels) == layers * heads
    # Row-major: layer l, head h is panel l * heads + h, and it shows exactly that matrix.
    for layer in range(layers):
        for head in range(heads):
            ax = panels[layer * heads + head]
            assert ax.get_title() == f"layer {layer + 1}, head {head + 1}"
            np.testing.assert_allclose(ax.images[0].get_array(), weights[layer, head].numpy())
    bottom_left = panels[(layers - 1) * heads]
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == src
    assert [t.get_text() for t in bottom_left.get_yticklabels()] == tgt

    path = plots.plot_attention(weights, src, tgt, tmp_path / "attention" / "ex0.png")
    image = read_png(path)
    assert image.shape[:2] == figure_pixels(fig)


def test_attention_heatmap_grows_with_grid_and_sentence(tmp_path):
    small = read_png(
        plots.plot_attention(
            random_attention(1, 2, 4, 4), list("abcd"), list("wxyz"), tmp_path / "s.png"
        )
    )
    src, tgt = [f"s{i}" for i in range(20)], [f"t{i}" for i in range(15)]
    large = read_png(
        plots.plot_attention(random_attention(2, 4, 15, 20), src, tgt, tmp_path / "l.png")
    )
    assert large.shape[0] > small.shape[0] and large.shape[1] > small.shape[1]


@pytest.mark.parametrize(
    "shape, src_len, tgt_len, message",
    [
        ((2, 5, 7), 7, 5, "shape \\(layers, heads, T, S\\)"),
        ((1, 2, 5, 7), 6, 5, "5 x 7 \\(target x source\\) but 5 target and 6 source"),
        ((1, 2, 5, 7), 7, 4, "but 4 target"),
        ((1, 0, 5, 7), 7, 5, "empty"),
    ],
)
def test_attention_heatmap_validates_input(shape, src_len, tgt_len, message):
    weights = torch.full(shape, 0.5)
    with pytest.raises(ValueError, match=message):
        plots.attention_figure(weights, ["x"] * src_len, ["y"] * tgt_len)


def test_attention_heatmap_rejects_nan():
    weights = random_attention(1, 1, 2, 2)
    weights[0, 0, 1, 1] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        plots.attention_figure(weights, ["a", "b"], ["c", "d"])


def make_history() -> list[dict]:
    """Like a training log: train/loss every 10 steps, validation every 50."""
    history = [{"step": s, "train/loss": 8.0 / (1 + s / 50)} for s in range(10, 201, 10)]
    history += [
        {"step": s, "val/loss": 7.0 / (1 + s / 60), "val/greedy_bleu": 30 * s / 200}
        for s in (50, 100, 150, 200)
    ]
    return history


def line_data(fig) -> dict[str, tuple[list, list]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
    }


def test_learning_curves_from_records_and_csv_agree(tmp_path):
    history = make_history()
    csv_path = tmp_path / "metrics.csv"
    columns = ["step", "epoch", "train/loss", "val/loss", "val/greedy_bleu"]
    with csv_path.open("w", newline="") as f:  # blanks where a metric was not logged
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for record in history:
            writer.writerow({"epoch": 0, **record})

    from_records = line_data(plots.learning_curves_figure(history))
    from_csv = line_data(plots.learning_curves_figure(csv_path))
    assert set(from_records) == {"train/loss", "val/loss", "val/greedy_bleu"}
    for key in from_records:
        np.testing.assert_allclose(from_csv[key], from_records[key])
    steps, bleu = from_records["val/greedy_bleu"]
    assert steps == [50, 100, 150, 200]
    assert bleu == pytest.approx([7.5, 15.0, 22.5, 30.0])
    assert len(from_records["train/loss"][0]) == 20

    path = plots.plot_learning_curves(csv_path, tmp_path / "curves.png", title="smoke")
    assert read_png(path).shape[:2] == figure_pixels(plots.learning_curves_figure(history))


def test_learning_curves_reject_empty_history(tmp_path):
    with pytest.raises(ValueError, match="no train/loss"):
        plots.learning_curves_figure([{"step": 1, "lr": 0.1}])
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("iteration,train/loss\n1,2.0\n")
    with pytest.raises(ValueError, match="no 'step' column"):
        plots.learning_curves_figure(bad_csv)


def test_bar_chart_with_error_bars(tmp_path):
    labels = ["base", "heads=1", "heads=16", "no tying"]
    values, errors = [35.1, 33.0, 34.8, 34.2], [0.9, 1.1, 0.8, 1.0]
    fig = plots.bar_chart_figure(labels, values, errors, ylabel="BLEU", baseline=35.1)
    ax = fig.axes[0]
    assert [round(bar.get_height(), 6) for bar in ax.patches] == values
    (caps_and_bars,) = [c for c in ax.containers if hasattr(c, "lines") and c.lines[2]]
    segments = caps_and_bars.lines[2][0].get_segments()
    assert [round(float(s[1][1] - s[0][1]) / 2, 6) for s in segments] == errors
    assert [t.get_text() for t in ax.get_xticklabels()] == labels

    path = plots.plot_bar_chart(labels, values, errors, tmp_path / "bars.png", ylabel="BLEU")
    assert read_png(path).shape[:2] == figure_pixels(fig)
    with pytest.raises(ValueError, match="4 labels, 3 values"):
        plots.bar_chart_figure(labels, values[:3], None, ylabel="BLEU")


def test_eleven_curves_are_told_apart_by_colour_or_line_style():
    curves = {f"variant_{i}": ([1, 2], [i, i + 1]) for i in range(11)}
    figure = plots.curves_figure(curves, xlabel="update", ylabel="BLEU")
    looks = [(line.get_color(), line.get_linestyle()) for line in figure.axes[0].get_lines()]
    assert len(looks) == 11 and len(set(looks)) == 11


def test_the_curves_legend_names_every_label_beside_the_axes_not_over_them():
    curves = {f"variant_{i}": ([200, 400, 600], [i, i + 5, i + 9]) for i in range(11)}
    figure = plots.curves_figure(curves, xlabel="update", ylabel="BLEU", title="curves")
    FigureCanvasAgg(figure).draw()
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == list(curves)
    drawn, axes = legend.get_window_extent(), figure.axes[0].get_window_extent()
    assert drawn.x0 >= axes.x1 and drawn.x1 <= figure.bbox.width, (drawn, axes)


def test_scatter_legend_names_each_label_and_marks_its_mean():
    points = {"base": [(7.4, 39.3), (7.8, 38.1)], "smoothing_0.0": [(8.7, 37.9), (8.8, 37.8)]}
    figure = plots.labelled_scatter_figure(points, xlabel="ppl", ylabel="BLEU")
    ax = figure.axes[0]
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(points)
    means = [line.get_xydata()[0] for line in ax.get_lines() if line.get_marker() == "x"]
    np.testing.assert_allclose(means, [[7.6, 38.7], [8.75, 37.85]])


def test_seed_points_show_points_and_intervals_on_an_axis_that_does_not_exaggerate():
    """Per variant: every seed a point and the mean with its interval, no bars (a bar's length
    from a cut axis exaggerates); the axis spans at least MIN_SPAN however close the scores
    are; the note (a verdict) is written under each label."""
    labels, notes = ["base", "heads_1"], ["(base)", "cannot tell (detects 1.92)"]
    seeds = [[37.9, 38.4, 37.2], [37.0, 36.8, 37.5]]
    fig = plots.seed_points_figure(labels, seeds, [0.6, None], ylabel="BLEU", notes=notes)
    ax = fig.axes[0]
    assert not ax.patches  # no bars
    low, high = ax.get_ylim()
    assert high - low >= plots.MIN_SPAN
    assert low <= min(map(min, seeds)) and high >= max(map(max, seeds))
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"{label}\n{note}" for label, note in zip(labels, notes)
    ]
    plotted = sorted(y for line in ax.get_lines() for y in line.get_ydata())
    assert {round(v, 6) for v in (*seeds[0], *seeds[1])} <= {round(float(y), 6) for y in plotted}
    (interval,) = [c for c in ax.containers if hasattr(c, "lines") and c.lines[2]]
    ((start, end),) = interval.lines[2][0].get_segments()
    assert end[1] - start[1] == pytest.approx(2 * 0.6)
    with pytest.raises(ValueError, match="one note per label"):
        plots.seed_points_figure(labels, seeds, [0.6, None], ylabel="BLEU", notes=notes[:1])


def drawn_inside(fig, title: str) -> None:
    """The figure's one title is drawn whole inside it: wrapped, not cut at its edges."""
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    drawn = ax.title.get_window_extent()
    assert 0 <= drawn.x0 and drawn.x1 <= fig.bbox.width, (drawn, fig.bbox.width)
    assert ax.title.get_text().split() == title.split()


def test_a_grid_heatmap_places_each_cell_on_a_scale_that_does_not_exaggerate():
    """Each value at its (row, column) with its text written on it; a cell without a value is
    blank and says '-'; the colour scale spans at least MIN_SPAN, so a difference within the
    noise is not painted as the whole range; a cell outside the axes is refused."""
    cells = {(2, 32): (37.11, "37.11\nheads_2"), (4, 32): (37.53, "37.53\nbase"),
             (8, 16): (37.24, "37.24\nheads_8")}  # fmt: skip
    fig = plots.grid_heatmap_figure(cells, row_labels=[2, 4, 8], column_labels=[16, 32],
                                    xlabel="d_k", ylabel="h", colorbar_label="BLEU")  # fmt: skip
    ax = fig.axes[0]
    (image,) = ax.images
    shown = image.get_array()
    assert shown[0, 1] == pytest.approx(37.11) and shown[1, 1] == pytest.approx(37.53)
    assert shown[2, 0] == pytest.approx(37.24)
    assert shown.mask.tolist() == [[True, False], [True, False], [False, True]]
    low, high = image.get_clim()
    assert high - low == pytest.approx(plots.MIN_SPAN) and low < 37.11 and 37.53 < high
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
             for t in ax.texts}  # fmt: skip
    assert texts == {(0, 0): "-", (0, 1): "37.11\nheads_2", (1, 0): "-", (1, 1): "37.53\nbase",
                     (2, 0): "37.24\nheads_8", (2, 1): "-"}  # fmt: skip
    assert [t.get_text() for t in ax.get_yticklabels()] == ["2", "4", "8"]
    with pytest.raises(ValueError, match=r"outside the given rows and columns: \[\(16, 8\)\]"):
        plots.grid_heatmap_figure({(16, 8): (30.0, "x")}, row_labels=[2], column_labels=[8],
                                  xlabel="", ylabel="", colorbar_label="")  # fmt: skip


@pytest.mark.parametrize("chart", ["scatter", "curves", "bars", "grid"])
def test_a_long_title_is_wrapped_inside_the_figure(chart):
    """A study report's title with 'interim, k of n' on the narrower charts (it overran the
    perplexity chart's edges)."""
    title = "label smoothing: val perplexity against BLEU (paper 5.4), interim, 45 of 55 " * 2
    if chart == "scatter":
        fig = plots.labelled_scatter_figure({"base": [(5.7, 39.0), (5.8, 38.1)]}, xlabel="PPL",
                                            ylabel="BLEU", title=title)  # fmt: skip
    elif chart == "curves":
        fig = plots.curves_figure({"base": ([200, 400], [2.1, 3.2])}, xlabel="update",
                                  ylabel="BLEU", title=title)  # fmt: skip
    elif chart == "bars":
        fig = plots.bar_chart_figure(["base"], [38.0], [0.6], ylabel="BLEU", title=title)
    else:
        fig = plots.grid_heatmap_figure({(4, 32): (38.0, "base")}, row_labels=[4],
                                        column_labels=[32], xlabel="d_k", ylabel="h",
                                        colorbar_label="BLEU", title=title)  # fmt: skip
    drawn_inside(fig, title)


def test_one_variants_seed_points_keep_the_whole_title_and_a_column_of_their_own():
    """A study with one variant so far (its base seeds): the title, which carries 'interim, k of
    n', is drawn whole inside the figure, and the column is centred, not stretched across it."""
    title = "table3_bc: one factor at a time, interim, 4 of 55"
    fig = plots.seed_points_figure(["base"], [[37.9, 36.7, 38.3, 36.8]], [1.3], ylabel="BLEU",
                                   title=title, notes=["(base)"])  # fmt: skip
    drawn_inside(fig, title)
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    xs = [x for line in ax.get_lines() for x in line.get_xdata()]
    assert low < min(xs) and max(xs) < high and max(xs) - min(xs) < (high - low) / 2
