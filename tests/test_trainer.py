"""Training runs with the real Lightning Trainer on real Multi30k pairs: overfitting, exact
resume, DDP on two CPU processes, divergence, accumulation, and the DVC stage."""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sacrebleu
import torch
import yaml
from lightning.pytorch.callbacks import Callback, EarlyStopping

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.data.datamodule import TranslationDataModule
from pipeline.errors import ConfigError
from pipeline.model.decoding import greedy_decode
from pipeline.rounding import FP32_EPS, float32_tolerance, reduction_length
from pipeline.sweep.spec_schema import OBJECTIVE_METRICS
from pipeline.tracking import offline_run_dirs, read_offline_run, start_wandb_run
from pipeline.training.checkpoints import (
    LAST_NAME,
    PROGRESS_NAME,
    checkpoint_dir,
    read_checkpoint,
    select_checkpoints,
)
from pipeline.training.loss import label_smoothed_nll
from pipeline.training.module import DivergedError, TranslationModule, inverse_sqrt_rate
from pipeline.training.precision import cpu_has_bf16_instructions
from pipeline.training.throughput import Throughput
from pipeline.training.trainer import build_callbacks, run
from tests.conftest import (
    RESUMED_RUN_ATOL,
    build_once,
    redirect_paths,
    run_stage,
    shared_build,
    shared_root,
    snapshot,
)

DATA = ["experiment=smoke", "data.max_train_pairs=200"]
TINY = [
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "train.max_tokens=1024",
    "train.warmup_steps=4",
    "train.lr_factor=0.5",
    "train.val_bleu_max_sentences=16",
    "train.progress_bar=false",
]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread here and in the processes the tests start: the cores are shared,
    and OpenMP with more threads than free cores slows these small models down 10-40x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
@shared_build
def tokenized_200(tmp_path_factory, multi30k_dir) -> config_schema.Config:
    """The first 200 training pairs (plus the full val/test splits), prepared and tokenized."""
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize

    root = shared_root(tmp_path_factory) / "tokenized_200"
    cfg = redirect_paths(config_lib.compose([f"data.raw_dir={multi30k_dir}", *DATA]), root)
    build_once(root, lambda: (prepare(cfg), tokenize(cfg)))
    return cfg


@pytest.fixture
def train_config(tokenized_200, tmp_path):
    """A config on the 200-pair data with `overrides`, writing under tmp_path/<name>."""

    def _make(*overrides: str, name: str = "run") -> config_schema.Config:
        raw_dir = tokenized_200.data.raw_dir
        cfg = config_lib.compose([f"data.raw_dir={raw_dir}", *DATA, *overrides])
        cfg = redirect_paths(cfg, tmp_path / name)
        cfg.paths.prepared = tokenized_200.paths.prepared
        cfg.paths.tokenized = tokenized_200.paths.tokenized
        return cfg

    return _make


def _train_batches_per_epoch(cfg: config_schema.Config) -> int:
    datamodule = TranslationDataModule(cfg)
    datamodule.setup("fit")
    return len(datamodule.train_dataloader())


class RecordBatches(Callback):
    """The example ids of every training batch, with the epoch they came in."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[int]]] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches.append((trainer.current_epoch, batch["ids"].tolist()))


# ---------------------------------------------------------------------- fast checks


def test_callbacks_rank_checkpoints_and_stop_early_by_the_monitored_metric(make_config):
    by_bleu = build_callbacks(make_config("train.early_stopping_patience=3", "train.save_top_k=4"))
    throughput, last_k, best_k, early = by_bleu
    assert isinstance(throughput, Throughput)
    assert (last_k.monitor, last_k.mode, last_k.save_top_k, last_k.save_last) == (
        "step", "max", 4, True)  # fmt: skip
    assert (best_k.monitor, best_k.mode, best_k.save_top_k) == ("val/greedy_bleu", "max", 4)
    assert isinstance(early, EarlyStopping)
    assert (early.monitor, early.patience, early.mode) == ("val/greedy_bleu", 3, "max")
    by_loss = build_callbacks(make_config("train.val_bleu=false"))
    assert [(c.monitor, c.mode) for c in by_loss[1:]] == [("step", "max"), ("val/loss", "min")]


def test_train_stage_refuses_progress_without_a_checkpoint(make_config, tmp_path):
    cfg = make_config()
    directory = checkpoint_dir(cfg.paths.train_dir)
    directory.mkdir(parents=True)
    (directory / PROGRESS_NAME).write_text('{"step": 500, "file": "last.ckpt"}')
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(config_lib.to_dict(cfg)))
    result = run_stage("train", tmp_path, ONE_THREAD_ENV)
    assert result.returncode == 2, result.stderr
    assert "error: " in result.stderr and "Traceback" not in result.stderr
    assert '"step": 500' in result.stderr and "train.resume=false" in result.stderr


# ---------------------------------------------------------------------- training runs


@pytest.mark.slow
def test_overfits_200_pairs_and_writes_every_output(train_config):
    cfg = train_config(
        "model.dropout=0",
        "train.label_smoothing=0",
        "runtime.compile_loss=true",  # the default recipes' compiled loss must fit the data too
        "train.max_steps=300",
        "train.warmup_steps=40",
        "train.lr_factor=0.3",
        "train.max_tokens=1024",
        "train.val_check_interval=150",
        "train.val_bleu_max_sentences=32",
        "train.log_every_n_steps=10",
        "train.progress_bar=false",
    )
    metrics = run(cfg)

    # Memorising 200 pairs (no dropout, no smoothing) drives the loss toward 0; a model that does
    # not fit them stays at several nats (each token guessed from its frequency): 0.5 lies
    # between the two, not at a level measured on one machine.
    assert metrics["last"]["train/loss"] < 0.5
    assert metrics["steps"] == 300
    assert metrics["num_parameters"] > 0 and metrics["train/mean_tokens_per_sec"] > 0
    assert metrics["val/greedy_bleu"] is not None and metrics["best_step"] in (150, 300)
    # whatever a sweep may optimise, training returns (a trial without it would fail unsaid)
    assert all(math.isfinite(metrics[name]) for name in OBJECTIVE_METRICS), metrics
    saved = json.loads((Path(cfg.paths.metrics_dir) / "train.json").read_text())
    assert saved == json.loads(json.dumps(metrics))

    # Checkpoints: last + the newest and the best by val/greedy_bleu, loadable on their own.
    names = sorted(p.name for p in checkpoint_dir(cfg.paths.train_dir).glob("*.ckpt"))
    assert LAST_NAME in names and "step-0000150.ckpt" in names and "step-0000300.ckpt" in names
    assert len([n for n in names if n.startswith("best-step-")]) == 2
    assert [p.name for p in select_checkpoints(cfg.paths.train_dir, 1, "last")] == [
        "step-0000300.ckpt"
    ]
    module = TranslationModule.load_from_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)
    assert module.cfg == cfg

    # val/greedy_bleu is sacreBLEU of greedy translations of the first 32 val sentences, here
    # decoded one at a time (no batching, padding or reordering).
    datamodule = TranslationDataModule(cfg)
    datamodule.setup("fit")
    val = datamodule.split(cfg.data.val_split)
    module.eval()
    hypotheses = []
    with torch.no_grad():
        for src_ids in val.src_ids[:32]:
            (tokens,) = greedy_decode(module.model, torch.tensor([src_ids]), bos_id=2, eos_id=3,
                                      max_len_a=cfg.eval.max_len_a, max_len_b=cfg.eval.max_len_b)  # fmt: skip
            hypotheses.append(datamodule.tokenizer.decode(tokens))
    expected_bleu = sacrebleu.corpus_bleu(hypotheses, [val.tgt_text[:32]]).score
    # sacrebleu's float64 score of the same hypotheses, logged as float32: one rounding.
    assert metrics["last"]["val/greedy_bleu"] == pytest.approx(expected_bleu, rel=FP32_EPS)

    # DVCLive learning curves (what `dvc plots` reads) and the PNG.
    live = Path(cfg.paths.plots_dir) / "train"
    rows = (live / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()
    assert rows[0] == "step\tloss" and rows[1].startswith("10\t") and rows[-1].startswith("300\t")
    assert (live / "plots" / "metrics" / "val" / "greedy_bleu.tsv").exists()
    assert (live / "learning_curve.png").stat().st_size > 0

    # One offline W&B run with the full config and the training history.
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    wandb_run = read_offline_run(run_dir)
    assert wandb_run["complete"]
    assert wandb_run["config"] == config_lib.to_dict(cfg)
    assert wandb_run["run"]["job_type"] == "train"
    logged = [row for row in wandb_run["history"] if "train/loss" in row]
    assert [row["trainer/global_step"] for row in logged] == list(range(10, 301, 10))
    assert logged[-1]["train/loss"] == pytest.approx(metrics["last"]["train/loss"])
    for row in logged:
        assert row["lr"] == pytest.approx(
            inverse_sqrt_rate(
                row["trainer/global_step"], d_model=64, warmup_steps=40, factor=0.3
            )  # fmt: skip
        )
    assert wandb_run["summary"]["best/val/greedy_bleu"] == pytest.approx(metrics["val/greedy_bleu"])
    # One name a number: W&B's tokens per second is each logging window's (its summary the last
    # window's), the run's mean is a name of its own, as in train.json.
    windows = [row["train/tokens_per_sec"] for row in logged]
    assert wandb_run["summary"]["train/tokens_per_sec"] == pytest.approx(windows[-1])
    mean = metrics["train/mean_tokens_per_sec"]
    assert wandb_run["summary"]["train/mean_tokens_per_sec"] == pytest.approx(mean)
    assert not {"val/bleu", "best/val/bleu"} & set(wandb_run["summary"])


# An lr so small that no weight changes in float32: the val loss stays bit for bit the same, so
# early stopping (patience 1, any decrease an improvement) ends the run at its second validation.
FROZEN = (
    "train.val_bleu=false",
    "train.early_stopping_patience=1",
    "train.lr_factor=1e-30",
    "train.max_steps=60",
    "train.val_check_interval=10",
    "train.warmup_steps=10",
    "train.max_tokens=1024",
    "train.log_every_n_steps=10",
    "train.progress_bar=false",
)


def test_a_run_early_stopping_ended_is_finished_not_resumed(train_config):
    """Early stopping ends a run short of train.max_steps. Run again (the same config, or one
    differing in a key that cannot change the weights, as a re-run stage or a retried sweep
    trial does), it is that finished run, recorded again: not an interrupted one trained on."""
    first = run(train_config(*FROZEN))
    assert first["steps"] == 20 < 60  # stopped at its second validation
    checkpoints = Path(train_config(*FROZEN).paths.train_dir) / "checkpoints"
    before = snapshot(checkpoints)
    again = run(train_config(*FROZEN, "train.log_every_n_steps=5"))
    assert again["steps"] == 20 and again["val/loss"] == first["val/loss"]
    assert snapshot(checkpoints) == before  # nothing trained, nothing saved


def test_the_check_stages_averaging_note_counts_the_checkpoints_a_run_saves(train_config):
    """A run saves a step checkpoint at each validation and at its last step: the note the
    check stage prints, before training, where eval.average asks for more, counts as many as
    a real run leaves for the evaluate stage to average."""
    from pipeline.preflight import averaging_note

    budget = [*TINY, "train.max_steps=5", "train.val_check_interval=2", "train.save_top_k=-1"]
    cfg = train_config(*budget, "eval.average=4")
    note = averaging_note(cfg)
    assert note and "eval.average=4, but this run saves 3 step checkpoint(s)" in note
    run(cfg)
    with pytest.warns(UserWarning, match="only 3 exist"):
        assert len(select_checkpoints(cfg.paths.train_dir, cfg.eval.average)) == 3
    assert averaging_note(train_config(*budget, "eval.average=3")) is None
    every_third = [*TINY, "train.max_steps=6", "train.val_check_interval=3", "eval.average=2"]
    assert averaging_note(train_config(*every_third)) is None


@pytest.mark.parametrize("speed_paths", ["true", "false"])  # false: the path a GPU takes
def test_resume_mid_epoch_matches_an_uninterrupted_run(train_config, speed_paths):
    common = [*TINY, "train.val_check_interval=6", "train.log_every_n_steps=3",
              f"runtime.cpu_speed_paths={speed_paths}", "model.dropout=0.1"]  # fmt: skip
    steps = 6
    interrupted = train_config(*common, f"train.max_steps={steps}", name="interrupted")
    per_epoch = _train_batches_per_epoch(interrupted)
    assert steps % per_epoch != 0 and 2 * steps > per_epoch  # stops mid-epoch, then crosses one

    run(interrupted)
    assert (
        read_checkpoint(checkpoint_dir(interrupted.paths.train_dir) / LAST_NAME)["global_step"]
        == steps
    )
    resumed_cfg = copy.deepcopy(interrupted)
    resumed_cfg.train.max_steps = 2 * steps
    recorder = RecordBatches()
    resumed = run(resumed_cfg, callbacks=[recorder])
    assert resumed["resumed_from"].endswith(LAST_NAME)

    straight_cfg = train_config(*common, f"train.max_steps={2 * steps}", name="straight")
    straight_recorder = RecordBatches()
    straight = run(straight_cfg, callbacks=[straight_recorder])

    assert recorder.batches == straight_recorder.batches[steps:]  # no batch skipped or repeated
    assert resumed["steps"] == straight["steps"] == 2 * steps
    a = read_checkpoint(checkpoint_dir(resumed_cfg.paths.train_dir) / LAST_NAME)
    b = read_checkpoint(checkpoint_dir(straight_cfg.paths.train_dir) / LAST_NAME)
    assert a["global_step"] == b["global_step"] == 2 * steps
    assert a["epoch"] == b["epoch"]
    for key, tensor in b["state_dict"].items():
        torch.testing.assert_close(a["state_dict"][key], tensor, atol=RESUMED_RUN_ATOL, rtol=0)
    assert a["lr_schedulers"][0]["_last_lr"] == b["lr_schedulers"][0]["_last_lr"]
    lr_a = a["optimizer_states"][0]["param_groups"][0]["lr"]
    assert lr_a == b["optimizer_states"][0]["param_groups"][0]["lr"]
    assert [r["step"] for r in a["history"]] == [r["step"] for r in b["history"]]
    assert resumed["val/loss"] == pytest.approx(straight["val/loss"], abs=RESUMED_RUN_ATOL)


@pytest.mark.skipif(not cpu_has_bf16_instructions(), reason="auto is 32-true without bf16")
def test_a_resumed_auto_precision_run_keeps_the_precision_it_trained_in(train_config):
    """`train.precision: auto` times bf16 against float32 when a run starts; a resumed run
    must not decide anew (on a busy machine the timing came out otherwise, and the resumed
    weights differed from the uninterrupted run's). The first half decides bf16 (any speed-up
    is enough), the second is told that only an impossible one is (`bf16_min_speedup` may
    differ on resume): it keeps bf16 and ends where an uninterrupted bf16 run ends."""
    common = [*TINY, "train.precision=auto", "train.val_check_interval=3"]
    steps = 6
    interrupted = train_config(*common, f"train.max_steps={steps}",
                               "runtime.bf16_min_speedup=0.001", name="interrupted")  # fmt: skip
    assert run(interrupted)["precision"] == "bf16-mixed"
    resumed_cfg = copy.deepcopy(interrupted)
    resumed_cfg.train.max_steps = 2 * steps
    resumed_cfg.runtime.bf16_min_speedup = 1e9  # auto, deciding now, would pick 32-true
    resumed = run(resumed_cfg)
    straight_cfg = train_config(*common, f"train.max_steps={2 * steps}",
                                "runtime.bf16_min_speedup=0.001", name="straight")  # fmt: skip
    straight = run(straight_cfg)

    assert resumed["resumed_from"]
    assert resumed["precision"] == straight["precision"] == "bf16-mixed"
    a, b = (read_checkpoint(checkpoint_dir(c.paths.train_dir) / LAST_NAME)
            for c in (resumed_cfg, straight_cfg))  # fmt: skip
    for key, tensor in b["state_dict"].items():
        torch.testing.assert_close(
            a["state_dict"][key], tensor, atol=RESUMED_RUN_ATOL, rtol=0, msg=key
        )


def test_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(
    train_config,
):
    class PoisonWeights(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if trainer.global_step == 4:  # the batch of optimizer step 5
                with torch.no_grad():
                    module.model.output_projection.weight.fill_(float("nan"))

    cfg = train_config(*TINY, "train.max_steps=20", "train.val_check_interval=2",
                       "train.log_every_n_steps=2", "train.val_bleu=false")  # fmt: skip
    with pytest.raises(DivergedError, match="NaN/inf at step 5.*last good checkpoint .*last.ckpt"):
        run(cfg, callbacks=[PoisonWeights()])
    last = read_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)
    assert last["global_step"] == 4
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)  # the W&B run was closed, not left open
    assert read_offline_run(run_dir)["complete"]


class RecordUpdates(Callback):
    """After each training batch: the optimizer steps done so far and whether the weights
    moved; at each optimizer step: the learning rate it applies."""

    def __init__(self) -> None:
        self.after_batch: list[tuple[int, bool]] = []
        self.step_lrs: list[float] = []
        self._before: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._before = module.model.output_projection.weight.detach().clone()

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.step_lrs.append(optimizer.param_groups[0]["lr"])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        moved = not torch.equal(self._before, module.model.output_projection.weight)
        self.after_batch.append((trainer.global_step, moved))


def test_accumulation_counts_optimizer_updates(train_config):
    """train.accumulate_grad_batches=2 (Wu et al.'s two GPUs in one process, as fairseq's
    --update-freq 2): one optimizer step per two batches, across an epoch whose token
    batches packed to an odd number, and max_steps, the warm-up and learning rate, the
    validation cadence and the step checkpoints all count those updates."""
    cfg = train_config(*TINY, "train.accumulate_grad_batches=2", "train.max_steps=9",
                       "train.warmup_steps=4", "train.val_check_interval=3",
                       "train.val_bleu=false", "train.precision=32-true",
                       "train.save_top_k=3")  # fmt: skip
    once = copy.deepcopy(cfg)
    once.train.accumulate_grad_batches = 1
    assert _train_batches_per_epoch(once) == 11  # packed: odd, so one batch is split in two
    assert _train_batches_per_epoch(cfg) == 12  # an epoch of 6 updates: 9 run into the next
    recorder = RecordUpdates()
    assert run(cfg, callbacks=[recorder])["steps"] == 9
    # Batch i (from 0) leaves (i + 1) // 2 updates done; only every second batch moves weights.
    assert recorder.after_batch == [((i + 1) // 2, i % 2 == 1) for i in range(18)]
    # Update k applies equation (3) at step k: rising to the peak at update 4 (batch 8).
    expected = [inverse_sqrt_rate(k, d_model=32, warmup_steps=4, factor=0.5) for k in range(1, 10)]
    assert recorder.step_lrs == pytest.approx(expected)
    assert max(recorder.step_lrs) == recorder.step_lrs[3]
    history = read_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)["history"]
    assert [r["step"] for r in history if "val/loss" in r] == [3, 6, 9]  # every 3 updates
    steps = sorted(p.name for p in checkpoint_dir(cfg.paths.train_dir).glob("step-*.ckpt"))
    assert steps == ["step-0000003.ckpt", "step-0000006.ckpt", "step-0000009.ckpt"]


class RecordFirstUpdate(Callback):
    """The weights before training, the batches of the first update, and the gradient its
    optimizer step applied (read as the second update clears it)."""

    def on_train_start(self, trainer, module) -> None:
        self.initial = copy.deepcopy(module.model.state_dict())
        self.batches: list[dict] = []
        self.grads: dict[str, torch.Tensor] | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == 0:
            self.batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})

    def on_before_zero_grad(self, trainer, module, optimizer) -> None:
        if trainer.global_step == 1 and self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in module.model.named_parameters()}


def autograd_update_gradients(cfg, initial: dict, batches: list[dict], per_token: bool):
    """(gradients, tolerances, target tokens per batch): what plain autograd gives an update
    of `batches` from the weights `initial`, for their loss summed over all their target tokens
    by their number (`per_token`, fairseq's) or for the mean of their per-token losses; and per
    parameter how far another float32 computation of its gradient may lie from it: each entry
    sums products along the model's reduction chain (`reduction_length`) and over the update's
    target tokens, `float32_tolerance` of that many terms at the size of the largest entry."""
    reference = TranslationModule(cfg, vocab_size=initial["src_embed.weight"].size(0))
    reference.model.load_state_dict(initial)
    sums, tokens = [], []
    for batch in batches:
        logits = reference.model(batch["src"], batch["tgt_in"])
        sums.append(label_smoothed_nll(logits, batch["tgt_out"], epsilon=cfg.train.label_smoothing,
                                       pad_id=reference.pad_id)[0])  # fmt: skip
        tokens.append(int(batch["tgt_out"].ne(reference.pad_id).sum()))
    if per_token:
        loss = sum(sums) / sum(tokens)
    else:
        loss = sum(total / count for total, count in zip(sums, tokens)) / len(sums)
    loss.backward()
    grads = {name: param.grad for name, param in reference.model.named_parameters()}
    terms = reduction_length(reference.model) + sum(tokens)
    tolerances = {name: float32_tolerance(terms, float(grad.abs().max()))
                  for name, grad in grads.items()}  # fmt: skip
    return grads, tolerances, tokens


@pytest.mark.parametrize("normalization", ["batch", "update"])
def test_loss_normalization_weighs_an_updates_batches_as_configured(train_config, normalization):
    """An update of two batches: `batch` averages their per-token losses, `update` (fairseq's)
    divides their summed loss by all their target tokens. The gradient the optimizer step got
    equals the one plain autograd gives for that loss, from the same weights and batches."""
    cfg = train_config(*TINY, "train.accumulate_grad_batches=2", "train.max_steps=2",
                       f"train.loss_normalization={normalization}", "model.dropout=0.0",
                       "train.precision=32-true", "train.val_check_interval=2",
                       "train.val_bleu=false", "train.gradient_clip_val=0")  # fmt: skip
    recorder = RecordFirstUpdate()
    run(cfg, callbacks=[recorder])
    expected, tolerances, tokens = autograd_update_gradients(
        cfg, recorder.initial, recorder.batches, per_token=normalization == "update"
    )
    assert len(tokens) == 2 and tokens[0] != tokens[1]  # the two weightings differ
    for name, grad in expected.items():
        torch.testing.assert_close(recorder.grads[name], grad, rtol=0, atol=tolerances[name])


@pytest.mark.slow
def test_accumulation_bf16_and_a_callers_wandb_run(train_config):
    # Under bf16 autocast as well: the loss is computed in fp32 (see label_smoothed_nll).
    cfg = train_config(*TINY, "train.accumulate_grad_batches=2", "train.max_steps=4",
                       "train.val_check_interval=2", "train.log_every_n_steps=1",
                       "train.val_bleu_max_sentences=4", "train.precision=bf16-mixed")  # fmt: skip
    recorder = RecordBatches()
    trial_run = start_wandb_run(cfg, job_type="trial", name="t-0001", group="study")
    metrics = run(cfg, callbacks=[recorder], wandb_run=trial_run)
    trial_run.log({"test/bleu": 1.0})  # the caller's run is still open after training
    trial_run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)  # training logged into it
    logged = read_offline_run(run_dir)
    assert logged["run"]["job_type"] == "trial"
    assert {"train/loss", "val/loss", "test/bleu"} <= {k for row in logged["history"] for k in row}
    assert metrics["precision"] == "bf16-mixed" and metrics["val/greedy_bleu"] is not None
    assert metrics["steps"] == 4 and len(recorder.batches) == 8  # 2 batches per step
    history = read_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)["history"]
    assert [r["step"] for r in history if "val/loss" in r] == [2, 4]
    logged_lr = [(r["step"], r["lr"]) for r in history if "lr" in r]
    assert logged_lr == [
        (s, pytest.approx(inverse_sqrt_rate(s, d_model=32, warmup_steps=4, factor=0.5)))
        for s in range(1, 5)
    ]


DDP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from lightning.pytorch.callbacks import Callback, EarlyStopping
    from pipeline.config import from_dict
    from pipeline.training.trainer import run

    class Record(Callback):
        def __init__(self):
            self.batches, self.first_update, self.grads, self.lrs = [], [], None, []
        def on_train_start(self, trainer, module):
            self.initial = {k: v.clone() for k, v in module.model.state_dict().items()}
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.batches.append((trainer.current_epoch, batch["ids"].tolist()))
            if trainer.global_step == 0:
                self.first_update.append({k: v for k, v in batch.items() if torch.is_tensor(v)})
        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.lrs.append(optimizer.param_groups[0]["lr"])
        def on_before_zero_grad(self, trainer, module, optimizer):
            if trainer.global_step == 1 and self.grads is None:  # after the first update
                self.grads = {n: p.grad.clone() for n, p in module.model.named_parameters()}
                self.after_first = {k: v.clone() for k, v in module.model.state_dict().items()}
        def on_train_end(self, trainer, module):
            torch.save({"batches": self.batches, "world_size": trainer.world_size,
                        "state_dict": module.model.state_dict(), "initial": self.initial,
                        "first_update": self.first_update, "grads": self.grads,
                        "after_first": self.after_first, "lrs": self.lrs},
                       f"{sys.argv[2]}/rank{trainer.global_rank}.pt")

    with open(sys.argv[1]) as f:
        cfg = from_dict(json.load(f))
    run(cfg, callbacks=[Record()])
    """
)


@pytest.mark.slow
def test_ddp_two_cpu_processes(train_config, tmp_path):
    # fairseq's loss normalization, whose token count is summed over the ranks
    ddp = [*TINY, "train.accelerator=cpu", "train.val_check_interval=4",
           "train.log_every_n_steps=2", "train.loss_normalization=update", "model.dropout=0.0",
           "train.precision=32-true", "train.gradient_clip_val=0"]  # fmt: skip
    cfg = train_config(*ddp, "train.devices=2", "train.max_steps=8")
    (tmp_path / "cfg.json").write_text(json.dumps(config_lib.to_dict(cfg)))
    (tmp_path / "ddp_run.py").write_text(DDP_SCRIPT)
    result = subprocess.run(
        [sys.executable, "ddp_run.py", "cfg.json", str(tmp_path)],
        cwd=tmp_path,
        env=ONE_THREAD_ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]

    # Epoch 0: disjoint halves that together hold every training pair once.
    first_epoch = [[i for epoch, ids in r["batches"] if epoch == 0 for i in ids] for r in ranks]
    assert not set(first_epoch[0]) & set(first_epoch[1])
    assert sorted(first_epoch[0] + first_epoch[1]) == list(range(200))
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 8
    # Identical weights on both ranks after training (DDP averaged every gradient).
    for key, tensor in ranks[0]["state_dict"].items():
        assert torch.equal(tensor, ranks[1]["state_dict"][key]), key
    # The first update's gradient: both ranks' summed loss over all their target tokens.
    batches = [batch for rank in ranks for batch in rank["first_update"]]
    expected, tolerances, _ = autograd_update_gradients(cfg, ranks[0]["initial"], batches,
                                                        per_token=True)  # fmt: skip
    for name, grad in expected.items():
        for rank in ranks:
            torch.testing.assert_close(rank["grads"][name], grad, rtol=0, atol=tolerances[name])

    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)  # exactly one W&B run
    wandb_run = read_offline_run(run_dir)
    assert any("train/loss" in row for row in wandb_run["history"])
    metrics = json.loads((Path(cfg.paths.metrics_dir) / "train.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 8

    # Extended on one process (train.devices is free: `auto` on another machine), its global
    # batch would halve mid-run: refused, naming the key, the run's checkpoints as they were.
    before = snapshot(checkpoint_dir(cfg.paths.train_dir))
    with pytest.raises(ConfigError, match=r"'train.devices': .* trained on 2 process\(es\) and "
                       r"would continue on 1"):  # fmt: skip
        run(train_config(*ddp, "train.devices=1", "train.max_steps=12"))
    assert snapshot(checkpoint_dir(cfg.paths.train_dir)) == before
    assert metrics["val/greedy_bleu"] is not None


# The float32 operations from a gradient to Adam's updated weight (the two moments, the square
# root, the bias corrections, the division, the subtraction), each rounding by at most eps.
ADAM_STEP_ROUNDINGS = 8


def adam_first_step_spread(grad, tolerance: float, lr: float, eps: float) -> torch.Tensor:
    """How far apart two first Adam updates of each weight may land when their gradients agree
    to ±`tolerance`. Adam's bias-corrected moments of one gradient are g and g², so the first
    update moves a weight by lr * g / (|g| + eps), which rises with g: over [g - tolerance,
    g + tolerance] it spans step(g + tolerance) - step(g - tolerance). That is ~0 where the
    gradient's sign is sure and up to 2 lr where the gradient is within rounding of 0."""

    def step(g: torch.Tensor) -> torch.Tensor:
        return lr * g / (g.abs() + eps)

    return step(grad + tolerance) - step(grad - tolerance)


def torchrun_env(node_rank: int, num_nodes: int, port: int) -> dict[str, str]:
    """What `torchrun --nnodes N --nproc-per-node 1 --node-rank R` gives its one process on
    machine R: Lightning's TorchElasticEnvironment reads it."""
    return {
        **ONE_THREAD_ENV,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "two-nodes",
        "WORLD_SIZE": str(num_nodes),
        "RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def start_ddp_script(cfg, folder: Path, env: dict) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(config_lib.to_dict(cfg)))
    (folder / "ddp_run.py").write_text(DDP_SCRIPT)
    return subprocess.Popen([sys.executable, "ddp_run.py", "cfg.json", str(folder)], cwd=folder,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


@pytest.mark.slow
def test_two_nodes_under_torchrun_take_the_updates_of_one_node_with_the_same_global_batch(
    train_config, tmp_path
):
    # Two machines of one process each, as torchrun starts them; the one-node run takes the
    # same global batch by accumulating the two batches the two nodes take side by side.
    same = (*TINY, "train.accelerator=cpu", "train.devices=1", "train.max_steps=6",
            "train.val_check_interval=6", "train.val_bleu_max_sentences=4",
            "train.loss_normalization=update", "model.dropout=0.0", "model.attention_dropout=0.0",
            "model.activation_dropout=0.0", "train.precision=32-true",
            "train.gradient_clip_val=0")  # fmt: skip
    two = train_config(*same, "train.num_nodes=2", name="two_nodes")
    one = train_config(*same, "train.accumulate_grad_batches=2", name="one_node")
    port = free_port()
    runs = [start_ddp_script(two, tmp_path / f"node{r}", torchrun_env(r, 2, port)) for r in (0, 1)]
    runs.append(start_ddp_script(one, tmp_path / "one", ONE_THREAD_ENV))
    for process in runs:
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, output[-3000:]

    nodes = [torch.load(tmp_path / f"node{r}" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    alone = torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    assert [n["world_size"] for n in nodes] == [2, 2] and alone["world_size"] == 1
    # The nodes took disjoint halves of the batches the one node took, in the same updates.
    taken = [ids for node in nodes for _, ids in node["batches"]]
    assert sorted(i for ids in taken for i in ids) == sorted(
        i for _, ids in alone["batches"] for i in ids
    )
    for key, tensor in alone["state_dict"].items():
        assert torch.equal(nodes[0]["state_dict"][key], nodes[1]["state_dict"][key]), key
        assert not torch.equal(tensor, alone["initial"][key]) or "norm" in key, key
    # The same learning rate at every update: both count the same optimizer steps.
    assert nodes[0]["lrs"] == nodes[1]["lrs"] == alone["lrs"] and len(alone["lrs"]) == 6
    # The first update, from the same weights: the nodes' averaged gradient is the one node's
    # accumulated one (two float32 sums of the same terms), and Adam moved each weight alike.
    _, tolerances, _ = autograd_update_gradients(one, alone["initial"], alone["first_update"],
                                                 per_token=True)  # fmt: skip
    lr = alone["lrs"][0]
    for name, grad in alone["grads"].items():
        torch.testing.assert_close(nodes[0]["grads"][name], grad, rtol=0, atol=tolerances[name])
        weights = alone["after_first"][name]
        apart = (nodes[0]["after_first"][name] - weights).abs()
        bound = adam_first_step_spread(grad, tolerances[name], lr, one.train.adam_eps)
        bound += float32_tolerance(ADAM_STEP_ROUNDINGS, weights.abs() + lr)
        assert bool((apart <= bound).all()), (name, float((apart - bound).max()))
    metrics = json.loads((Path(two.paths.metrics_dir) / "train.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 6


def test_several_nodes_started_without_a_cluster_launcher_are_refused_before_training(
    train_config, monkeypatch
):
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    cfg = train_config(*TINY, "train.accelerator=cpu", "train.devices=1", "train.num_nodes=2",
                       "train.ddp_timeout=5")  # fmt: skip
    with pytest.raises(ConfigError, match=r"train\.num_nodes.*torchrun.*srun"):
        run(cfg)
    assert not Path(cfg.paths.train_dir).exists()  # refused before anything was written

    monkeypatch.setenv("LOCAL_RANK", "0")  # launched, but as 3 processes, not 2 x 1
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"train\.num_nodes.*make 2 processes.*started 3"):
        run(cfg)


def test_num_nodes_is_validated_naming_the_key(make_config):
    with pytest.raises(ConfigError, match=r"train\.num_nodes.*got 0"):
        make_config("train.num_nodes=0")


def test_max_positions_shorter_than_the_data_is_refused_before_training(tokenized_smoke, tmp_path):
    cfg = redirect_paths(copy.deepcopy(tokenized_smoke), tmp_path)
    cfg.paths.prepared, cfg.paths.tokenized = (tokenized_smoke.paths.prepared,
                                               tokenized_smoke.paths.tokenized)  # fmt: skip
    cfg.model.positional, cfg.model.max_positions = "learned", 8
    with pytest.raises(ConfigError, match=r"'model.max_positions'=8 is shorter than the data: "
                                          r"split 'train' example \d+ has a (source|target) of"):  # fmt: skip
        run(cfg)
    assert not checkpoint_dir(cfg.paths.train_dir).exists()  # nothing trained, nothing saved
    assert offline_run_dirs(cfg.paths.wandb_dir) == []  # no W&B run started


@pytest.mark.slow
@pytest.mark.parametrize(
    ("full", "named"),
    [
        ("metrics_dir", "train.json"),  # the run trains to its end, then cannot write its summary
        ("plots_dir", "metrics.json"),  # DVCLive's summary: its first write does not fit
    ],
)
def test_a_full_disk_for_metrics_or_plots_exits_2_naming_the_file_and_keeps_the_run(
    train_config, tmp_path, small_disk, full, named
):
    cfg = train_config(*TINY, "train.max_steps=10", "train.val_check_interval=5",
                       "train.log_every_n_steps=5")  # fmt: skip
    setattr(cfg.paths, full, str(small_disk.path / full))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(config_lib.to_dict(cfg)))
    small_disk.fill(free=0)
    result = run_stage("train", tmp_path, env=ONE_THREAD_ENV)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"{named}: disk full (no space left on device) while writing it" in result.stderr, (
        result.stderr[-600:]
    )
    written = [p for p in small_disk.path.rglob("*") if p.is_file() and p.name != ".filler"]
    assert all(p.stat().st_size > 0 for p in written), written  # no empty or half files
    assert not [p for p in written if ".tmp-" in p.name]
    if full == "metrics_dir":  # the run is kept: the same command records it once there is room
        assert read_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)["global_step"] == 10


@pytest.mark.slow
def test_a_finished_run_recorded_again_trains_nothing_and_starts_no_wandb_run(
    trained_smoke, tmp_path
):
    """`dvc exp run -f` over a finished run of the same config and code: the train stage
    records it again without a step of training and without an empty W&B run."""
    import shutil

    cfg = copy.deepcopy(trained_smoke)
    shutil.copytree(cfg.paths.train_dir, tmp_path / "train")
    for name in ("train_dir", "metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(tmp_path / name.removesuffix("_dir")))
    summary = run(cfg)
    assert summary["steps"] == cfg.train.max_steps
    assert offline_run_dirs(cfg.paths.wandb_dir) == []
    recorded = json.loads((tmp_path / "metrics" / "train.json").read_text())
    assert recorded["steps"] == cfg.train.max_steps


# Figures of this process, not of the run: the time this command took and what it resumed from.
PROCESS_FIGURES = ("process_wall_time_s", "resumed_from")


def test_a_finished_run_recorded_again_keeps_every_figure(trained_smoke, tmp_path):
    """The train stage run again over a finished run (after a SIGTERM to `dvc repro` once
    training had ended, or after `rm` of metrics/train.json) trains nothing and writes the
    run's train.json again: every figure of the run as it was (epochs included)."""
    import shutil

    cfg = copy.deepcopy(trained_smoke)
    for name in ("metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(tmp_path / name))
    cfg.paths.train_dir = str(tmp_path / "train")
    shutil.copytree(trained_smoke.paths.train_dir, cfg.paths.train_dir)
    finished = json.loads((Path(trained_smoke.paths.metrics_dir) / "train.json").read_text())
    run(cfg)
    again = json.loads((tmp_path / "metrics_dir" / "train.json").read_text())
    assert again["resumed_from"] == str(Path(cfg.paths.train_dir) / "checkpoints" / "last.ckpt")
    assert finished["epochs"] >= 1
    for key in PROCESS_FIGURES + ("checkpoint_dir",):  # checkpoint_dir: where the copy lies
        finished.pop(key), again.pop(key)
    assert again == finished
