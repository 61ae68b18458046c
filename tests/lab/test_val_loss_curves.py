"""The parity runs' validation losses, fairseq's (bits, per epoch) against ours (nats), on one scale."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from benchmarks.fairseq import val_loss_curves
from pipeline import docs_blocks


@pytest.fixture
def parity_dir(tmp_path):
    epochs = [{"epoch": e, "updates": 62 * e, "val_loss": 8.0 / e} for e in range(1, 11)]
    budget = {"max_update": 620}
    (tmp_path / "fairseq_a.json").write_text(json.dumps({"per_epoch": epochs, "recipe": budget}))
    other = [{"epoch": e, "updates": 60 * e, "val_loss": 9.0 / e} for e in range(1, 11)]
    (tmp_path / "fairseq_b.json").write_text(json.dumps({"per_epoch": other, "recipe": budget}))
    # a longer run: its first epochs are no seed of the reference's budget
    longer = [{"epoch": e, "updates": 62 * e, "val_loss": 1.0} for e in range(1, 21)]
    (tmp_path / "fairseq_longer.json").write_text(
        json.dumps({"per_epoch": longer, "recipe": {"max_update": 1240}})
    )
    (tmp_path / "fairseq_no_curve.json").write_text(json.dumps({"scores": {}}))
    diagnostics = tmp_path / "diagnostics"
    diagnostics.mkdir()
    rows = "".join(f"{61 * e}\t{6.0 / e}\n" for e in range(1, 6))  # ours: 61 updates an epoch
    (diagnostics / "ours_x.val_loss.tsv").write_text("step\tloss\n" + rows)
    begin, end = docs_blocks.markers(val_loss_curves.BLOCK)
    readme = f"# Diagnostics\n\n{begin}\nstale\n{end}\nafter\n"
    (diagnostics / "README.md").write_text(readme)
    return tmp_path


def test_curves_share_a_scale_and_ours_is_read_at_fairseqs_updates(parity_dir):
    fairseq = val_loss_curves.fairseq_curves(parity_dir, max_update=620)
    assert list(fairseq) == ["fairseq_a", "fairseq_b"]  # one without per-epoch losses: none
    assert list(val_loss_curves.fairseq_curves(parity_dir)) == [
        "fairseq_a",
        "fairseq_b",
        "fairseq_longer",
    ]
    updates, losses = fairseq["fairseq_a"]
    assert updates[2] == 186 and losses[1] == pytest.approx(4.0 * math.log(2))  # bits -> nats
    ours = val_loss_curves.our_curves(parity_dir / "diagnostics")["ours_x"]
    # update 124 lies between our validations at 122 (3.0) and 183 (2.0)
    assert val_loss_curves.read_at(ours, 124) == pytest.approx(
        np.interp(124, [122, 183], [3.0, 2.0])
    )
    assert val_loss_curves.read_at(ours, 60) is None and val_loss_curves.read_at(ours, 306) is None


def test_cli_writes_the_figure_and_the_readme_table(parity_dir, capsys):
    diagnostics = parity_dir / "diagnostics"
    val_loss_curves.cli(["--parity-dir", str(parity_dir), "--diagnostics", str(diagnostics),
                       "--reference", "fairseq_a"])  # fmt: skip
    printed = capsys.readouterr().out
    assert (diagnostics / val_loss_curves.FIGURE).stat().st_size > 0
    text = (diagnostics / "README.md").read_text()
    assert "stale" not in text and printed in text and text.endswith("after\n")
    rows = {line.split(" | ")[0].strip("| "): line for line in printed.splitlines()[2:]}
    fairseq_124 = 4.0 * math.log(2)  # the reference's own validation
    other_124 = np.interp(124, [120, 180], [4.5, 3.0]) * math.log(2)  # read between two
    ours_124 = np.interp(124, [122, 183], [3.0, 2.0])
    mean = (fairseq_124 + other_124) / 2
    assert rows["124"].startswith(f"| 124 | {fairseq_124:.3f} | {other_124:.3f} | ")
    assert rows["124"].endswith(f"| {ours_124:.3f} ({ours_124 - mean:+.3f}) |")
    assert rows["620"].endswith("| - |")  # past our last validation: not extrapolated


def test_readme_table_is_the_commands_output():
    from tests.conftest import REPO_ROOT

    parity_dir, reference = REPO_ROOT / val_loss_curves.PARITY_DIR, "fairseq_wu2021_3000_seed1"
    curves = val_loss_curves.fairseq_curves(
        parity_dir, val_loss_curves.budget(parity_dir, reference)
    )
    ours = val_loss_curves.our_curves(REPO_ROOT / val_loss_curves.DIAGNOSTICS)
    block = "\n".join(val_loss_curves.table(reference, curves, ours)) + "\n"
    committed = docs_blocks.read(REPO_ROOT / val_loss_curves.DIAGNOSTICS / "README.md",
                                 val_loss_curves.BLOCK)  # fmt: skip
    assert committed == block


def test_the_parity_pages_reading_of_the_curves_is_the_tables():
    """docs/parity-comparisons.md's paragraph on the validation loss quotes the committed table: the span of
    ours - fairseq's mean over the first updates and from a later update on, how far fairseq's
    own seeds lie apart from then on, and the late updates where every one of ours lies above
    that mean."""
    from tests.conftest import REPO_ROOT

    block = docs_blocks.read(REPO_ROOT / val_loss_curves.DIAGNOSTICS / "README.md",
                             val_loss_curves.BLOCK)  # fmt: skip
    header, _, *lines = block.splitlines()
    fairseq_columns = sum("fairseq mean" not in name for name in header.strip("|").split("|")[1:])
    rows = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        fairseq = [float(cell) for cell in cells[1 : 1 + fairseq_columns] if cell != "-"]
        ours = [float(d) for d in re.findall(r"\(([+-]\d+\.\d+)\)", line)]
        rows[int(cells[0])] = (fairseq, ours)

    def span(keep) -> tuple[float, float]:
        differences = [d for update, (_, ours) in rows.items() if keep(update) for d in ours]
        return min(differences), max(differences)

    first, later, late = (
        span(lambda u: u <= 560),
        span(lambda u: u >= 372),
        span(lambda u: u >= 2480),
    )
    seed_gap = max(max(fairseq) - min(fairseq) for u, (fairseq, _) in rows.items() if u >= 372)
    assert late[0] > 0
    page = " ".join((REPO_ROOT / "docs/parity-comparisons.md").read_text(encoding="utf-8").split())
    assert (
        f"our curves lie {first[0]:.2f} to {first[1]:+.2f} nats from fairseq's two-seed mean over "
        f"the first 560 updates and {later[0]:.2f} to {later[1]:+.2f} from update 372 on, where "
        f"fairseq's two seeds lie up to {seed_gap:.2f} apart; from update 2480 on every one of "
        f"ours lies above that mean ({late[0]:+.2f} to {late[1]:+.2f})"
    ) in page
