"""benchmarks.fairseq.lockstep_check: the flags that give fairseq our schedule and step,
the snapshot marks, the distance between two sets of weights, and (slow, with a fairseq venv
built beforehand) the real fairseq trainer and our Lightning module taking the same updates
from the same weights to the same place, clipping included."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from benchmarks.fairseq import lockstep_check, train_peer
from pipeline.rounding import float32_tolerance, reduction_length
from tests.lab.test_train_peer import flag_values


def test_snapshot_marks_are_one_two_five_per_decade_and_the_last():
    assert lockstep_check.snapshot_updates(200) == [1, 2, 5, 10, 20, 50, 100, 200]
    assert lockstep_check.snapshot_updates(7) == [1, 2, 5, 7]


def test_weights_apart_is_relative_to_fairseqs_weights():
    theirs = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([4.0])}
    ours = {"a": torch.tensor([1.0, -1.0]), "b": torch.tensor([4.0]), "only.ours": torch.ones(1)}
    apart = lockstep_check.weights_apart(ours, {**theirs, "encoder.version": torch.ones(1)})
    assert apart["max_relative"] == pytest.approx(0.5)  # |(-1) - (-2)| / max |a| = 1 / 2
    assert apart["relative_norm"] == pytest.approx(1 / math.sqrt(1 + 4 + 16))


def test_fairseq_gets_the_recipes_schedule_and_step(make_config):
    cfg = make_config("experiment=multi30k_wu2021")
    flags = flag_values(lockstep_check.fairseq_flags_for(cfg, warmup_init_lr=1e-7))
    assert float(flags["--lr"]) == pytest.approx(0.005, rel=1e-6)  # the preset's peak
    assert flags["--lr-scheduler"] == "inverse_sqrt" and flags["--warmup-updates"] == "2000"
    assert float(flags["--warmup-init-lr"]) == 1e-7 and float(flags["--clip-norm"]) == 25.0
    assert flags["--label-smoothing"] == "0.1" and flags["--optimizer"] == "adam"
    assert lockstep_check.fairseq_flags_for(cfg, 1e-7).count("--lr") == 1


def lockstep_config(tokenized_smoke):
    """The smoke run's data and sizes with the recipe's step: two batches per update, the
    loss over the update's tokens, fairseq's init, and a clip that the first updates reach."""
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.train.accumulate_grad_batches = 2
    cfg.train.loss_normalization = "update"
    cfg.train.batch_budget = "max"
    cfg.train.gradient_clip_val = 0.5
    cfg.model.init = "fairseq"
    return cfg


# fairseq logs the loss (in bits) and the gradient norm rounded to 3 decimals: half a unit of
# the last one either way.
LOGGED_ROUNDING = 0.5e-3
LOCKSTEP_UPDATES = 5


@pytest.mark.slow
@pytest.mark.skipif(
    train_peer.built_venv(train_peer.DEFAULT_VENV) is None,
    reason="no fairseq venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`)",
)
def test_ours_and_fairseqs_trainer_take_the_same_updates(tokenized_smoke):
    from pipeline.model.transformer import Transformer

    cfg = lockstep_config(tokenized_smoke)
    t = cfg.train
    ours_first = t.lr_factor * cfg.model.d_model**-0.5 * t.warmup_steps**-1.5
    every_update = range(1, LOCKSTEP_UPDATES + 1)
    result = lockstep_check.lockstep(cfg, LOCKSTEP_UPDATES, venv=train_peer.DEFAULT_VENV,
                                       threads=1, warmup_init_lr=ours_first,
                                       snapshots=every_update)  # fmt: skip
    rows = result["rows"]
    assert [row["update"] for row in rows] == list(every_update)
    assert any(row["grad_norm_ours"] > t.gradient_clip_val for row in rows)  # clipping ran

    model = Transformer(cfg.model, result["vocab_size"], cfg.data.tokenizer.pad_id)
    chain = reduction_length(model)
    gap_before = 0.0  # ||ours - fairseq|| of the weights the update starts from
    for row in rows:
        # fairseq's warm-up runs linearly from its start to the peak: its update k takes
        # start + (k - 1) (peak - start) / warmup, ours k peak / warmup; from the same start
        # (peak / warmup) they differ by (k - 1) / (k warmup) of ours, less than 1 / warmup.
        assert row["lr_fairseq"] == pytest.approx(row["lr_ours"], rel=1 / t.warmup_steps)
        # The update's loss per target token: a sum over its tokens of the model's chain,
        # float32 in both (any order), logged rounded (in bits); to first order, weights
        # `gap_before` apart change it by at most ||gradient|| * gap_before (Cauchy-Schwarz).
        terms = chain + row["target_tokens"]
        loss_tolerance = (LOGGED_ROUNDING * math.log(2)
                          + float32_tolerance(terms, row["loss_ours"])
                          + row["grad_norm_ours"] * gap_before)  # fmt: skip
        assert row["loss_ours"] == pytest.approx(row["loss_fairseq"], abs=loss_tolerance)
        if row["update"] == 1:  # from the same weights: the same gradient, to float32
            norm_tolerance = (LOGGED_ROUNDING
                              + float32_tolerance(terms, row["grad_norm_ours"]))  # fmt: skip
            assert row["grad_norm_ours"] == pytest.approx(row["grad_norm_fairseq"],
                                                          abs=norm_tolerance)  # fmt: skip
        gap_before = row["weights_apart"]["difference_norm"]

    # fairseq's own warm-up start: its first update at 1e-7, ours at lr / warmup. Removing that
    # known difference (above) brings the two sets of weights closer.
    unaligned = lockstep_check.lockstep(cfg, LOCKSTEP_UPDATES, venv=train_peer.DEFAULT_VENV,
                                          threads=1, warmup_init_lr=None)["rows"]  # fmt: skip
    assert unaligned[0]["lr_fairseq"] == pytest.approx(1e-7)
    assert unaligned[0]["lr_ours"] == pytest.approx(ours_first)
    apart = [r[-1]["weights_apart"]["relative_norm"] for r in (rows, unaligned)]
    assert apart[1] > apart[0], apart


def test_summary_shows_the_updates_where_weights_were_compared(tmp_path):
    rows = [{"update": n, "lr_ours": 1e-4 * n, "lr_fairseq": 1e-4 * n - 1e-7,
             "loss_ours": 9.0 / n, "loss_fairseq": 9.0 / n + 1e-4,
             "grad_norm_ours": 2.0, "grad_norm_fairseq": 2.001} for n in (1, 2, 3)]  # fmt: skip
    rows[0]["weights_apart"] = {"relative_norm": 2.5e-7, "max_relative": 1e-3}
    rows[2]["weights_apart"] = {"relative_norm": 4.4e-6, "max_relative": 1e-2}
    result = {"updates": 3, "warmup_init_lr_fairseq": 1e-7, "rows": rows,
              "provenance": {"hardware": "a CPU", "commit": "abc1234"}}  # fmt: skip
    path = tmp_path / "lockstep_3.json"
    path.write_text(json.dumps(result))
    block = lockstep_check.markdown([path])
    lines = block.splitlines()
    assert (
        lines[0]
        == "`lockstep_3.json`: 3 updates, fairseq's warm-up from 1e-07 (a CPU, commit abc1234)"
    )
    table = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert table == [
        "| 1 | 1.000e-04 | 9.990e-05 | 9.0000 | 9.0001 | 2.000 | 2.001 | 2.5e-07 |",
        "| 3 | 3.000e-04 | 2.999e-04 | 3.0000 | 3.0001 | 2.000 | 2.001 | 4.4e-06 |",
    ]  # update 2 had no weights compared
    assert block.endswith("\n")


def test_diagnostics_readme_block_is_the_commands_output():
    from benchmarks.fairseq.parity import PARITY_DIR
    from pipeline import docs_blocks
    from tests.conftest import REPO_ROOT

    diagnostics = REPO_ROOT / PARITY_DIR / "diagnostics"
    results = sorted(diagnostics.glob("lockstep_*.json"))
    committed = docs_blocks.read(diagnostics / "README.md", lockstep_check.BLOCK)
    assert committed == lockstep_check.markdown(results)
