"""Validation loss per update of the parity runs, fairseq against ours, on one scale.

    python -m benchmarks.fairseq.val_loss_curves   # results/parity/diagnostics/val_loss.png + its README table

fairseq logs its validation loss in bits after each epoch (its `per_epoch` in
`results/parity/<run>.json`, from `benchmarks.fairseq.train_peer`); ours logs it in nats every
`train.val_check_interval` updates (a run's dvclive `plots/train/plots/metrics/val/loss.tsv`,
committed as `results/parity/diagnostics/<curve>.val_loss.tsv`). Both are the label-smoothed loss
per target subword. Here both are in nats, and each of our curves is read at fairseq's
validation updates by linear interpolation between its two neighbouring validations (the epochs
do not line up: fairseq's hold 62 updates, ours 61). Where the two segment the text differently
(sentencepiece against subword-nmt), a loss per subword is not the same quantity: the curves
made on Wu et al.'s own segmentation (`benchmarks.fairseq.wu2021_segmentation`) are the like-for-like ones.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from benchmarks.fairseq.parity import PARITY_DIR
from pipeline import docs_blocks
from pipeline.cli import main

DIAGNOSTICS = PARITY_DIR / "diagnostics"
CURVE_SUFFIX = ".val_loss.tsv"
FIGURE = "val_loss.png"
BLOCK = "curves"  # the diagnostics README's generated table
TABLE_EVERY = 5  # epochs between the rows past the first FIRST_EPOCHS (the last always shown)
FIRST_EPOCHS = 10  # every one of them: where the short diagnostic runs end
ZOOM_FROM = 1000  # updates: the right panel shows where the curves flatten


def budget(parity_dir: Path, run: str) -> int:
    """The updates fairseq's `run` was allowed (`--max-update`)."""
    recipe = json.loads((parity_dir / f"{run}.json").read_text(encoding="utf-8"))["recipe"]
    return recipe["max_update"]


def fairseq_curves(
    parity_dir: Path, max_update: int | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (updates, val loss in nats) of each fairseq run with per-epoch losses; with
    `max_update`, only the runs allowed that budget (its seeds, not a longer run's start)."""
    curves = {}
    for path in sorted(parity_dir.glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        if max_update is not None and payload.get("recipe", {}).get("max_update") != max_update:
            continue
        epochs = payload.get("per_epoch") or []
        points = [(e["updates"], e["val_loss"] * math.log(2)) for e in epochs
                  if e.get("val_loss") is not None]  # fmt: skip
        if points:
            updates, losses = zip(*points)
            curves[path.stem] = (np.array(updates), np.array(losses))
    return curves


def our_curves(diagnostics: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (updates, val loss in nats) of each committed `<name>.val_loss.tsv`."""
    curves = {}
    for path in sorted(diagnostics.glob(f"*{CURVE_SUFFIX}")):
        rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
        steps, losses = zip(*((int(s), float(v)) for s, v in rows if s))
        curves[path.name.removesuffix(CURVE_SUFFIX)] = (np.array(steps), np.array(losses))
    return curves


def read_at(curve: tuple[np.ndarray, np.ndarray], update: int) -> float | None:
    """The curve at `update`, interpolated linearly; None outside its validations."""
    steps, losses = curve
    if update < steps[0] or update > steps[-1]:
        return None
    return float(np.interp(update, steps, losses))


def table(reference: str, curves: dict, ours: dict) -> list[str]:
    """Markdown: at every TABLE_EVERY-th validation of fairseq's `reference` run, every fairseq
    run's loss and each of our curves read there, with its difference to the fairseq runs'
    mean (seeds of one system differ too: the fairseq columns show by how much)."""
    updates, losses = curves[reference]
    theirs = [reference, *sorted(set(curves) - {reference})]
    names = sorted(ours)
    lines = [
        "| updates | " + " | ".join(theirs) + " | "
        + " | ".join(f"{n} (- fairseq mean)" for n in names) + " |",
        "|---|" + "---|" * (len(theirs) + len(names)),
    ]  # fmt: skip
    shown = [i for i in range(len(updates)) if (i + 1) % TABLE_EVERY == 0 or i < FIRST_EPOCHS - 1]
    shown += [] if len(updates) - 1 in shown else [len(updates) - 1]
    for i in shown:
        at = int(updates[i])
        fairseq = [read_at(curves[name], at) for name in theirs]
        known = [value for value in fairseq if value is not None]
        mean = sum(known) / len(known)
        cells = ["-" if value is None else f"{value:.3f}" for value in fairseq]
        for name in names:
            value = read_at(ours[name], at)
            cells.append("-" if value is None else f"{value:.3f} ({value - mean:+.3f})")
        lines.append(f"| {at} | " + " | ".join(cells) + " |")
    return lines


def plot(curves: dict, ours: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(12, 4.5))
    for panel, start in zip(panels, (0, ZOOM_FROM)):
        for name, (steps, losses) in {**curves, **ours}.items():
            keep = steps >= start
            style = "-" if name in curves else "--"
            panel.plot(steps[keep], losses[keep], style, marker=".", ms=3, lw=1.2, label=name)
        panel.set_xlabel("updates")
        panel.set_ylabel("val loss (label-smoothed, nats per target subword)")
        panel.grid(alpha=0.3)
    panels[0].set_title("all updates")
    panels[1].set_title(f"from update {ZOOM_FROM}")
    panels[1].legend(fontsize=7)
    fig.suptitle("Wu et al.'s recipe: fairseq (solid) against ours (dashed)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fairseq.val_loss_curves", description=__doc__
    )
    parser.add_argument("--parity-dir", type=Path, default=PARITY_DIR)
    parser.add_argument("--diagnostics", type=Path, default=DIAGNOSTICS)
    parser.add_argument("--reference", default="fairseq_wu2021_3000_seed1",
                        help="the fairseq run whose validations the table reads, and whose "
                             "budget the fairseq runs shown share")  # fmt: skip
    args = parser.parse_args(argv)
    curves = fairseq_curves(args.parity_dir, budget(args.parity_dir, args.reference))
    ours = our_curves(args.diagnostics)
    plot(curves, ours, args.diagnostics / FIGURE)
    block = "\n".join(table(args.reference, curves, ours)) + "\n"
    docs_blocks.fill(args.diagnostics / "README.md", BLOCK, block)
    print(block, end="")


if __name__ == "__main__":
    main(cli)
