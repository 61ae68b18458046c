"""Ours and fairseq trained in lockstep: the same weights, the same batches, update by update:
is a training step computed otherwise by the two?

Both start from one set of weights (ours, `model.init` as configured, copied into fairseq's
TransformerModel as `benchmarks.fairseq.decode_checkpoint` copies them) and take the same first
`--updates` updates of the run's own training batches (its token batch sampler, two batches
per update under the recipe): ours through a real Lightning Trainer with this pipeline's
`TranslationModule` (accumulation, the update's loss normalisation, clipping, the warm-up
schedule), fairseq through its own `fairseq.trainer.Trainer.train_step` with the recipe's
flags (Adam, inverse_sqrt from --warmup-init-lr, --clip-norm, label_smoothed_cross_entropy).
Dropout is off in both (its masks cannot be shared) and both run in float32. Recorded per
update: the learning rate, the loss per target token, the gradient norm after normalisation
and, at a few updates, how far the two sets of weights are apart (largest difference relative
to the tensor's largest weight, and the relative size of the whole difference).

    python -m benchmarks.fairseq.lockstep_check --out results/parity/diagnostics/lockstep.json
        [--updates 200] [--warmup-init-lr-as-ours] [--threads 2]
    python -m benchmarks.fairseq.lockstep_check --summarize RESULT... [--update-readme README]

Run it in a run's folder (its params.yaml and tokenized data, after `dvc repro tokenize`).
`--warmup-init-lr-as-ours` starts fairseq's warm-up where ours starts (its first update at
lr / warmup instead of 1e-7) to see what remains without that known difference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

SPEC_FILE = "spec.json"
WEIGHTS_FILE = "weights.pt"  # fairseq names, as benchmarks.fairseq.decode_checkpoint writes them
BATCHES_FILE = "batches.pt"  # list of updates, each a list of batches (src, tgt_in, tgt_out)
RECORD_FILE = "fairseq_record.json"
SNAPSHOTS_FILE = "fairseq_snapshots.pt"  # {update: fairseq state dict}
BATCH_KEYS = ("src", "tgt_in", "tgt_out")


def snapshot_updates(updates: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `updates` (and `updates` itself)."""
    marks, scale = set(), 1
    while scale <= updates:
        marks |= {m * scale for m in (1, 2, 5) if m * scale <= updates}
        scale *= 10
    return sorted(marks | {updates})


# ---------------------------------------------------------------- the worker (fairseq venv)


def worker_main(folder: Path) -> None:
    from fairseq import metrics
    from fairseq.trainer import Trainer

    from benchmarks.fairseq.decode_checkpoint import load_into_fairseq
    from benchmarks.fairseq.step_speed import build_task_and_model, fairseq_sample, quiet_fairseq

    quiet_fairseq()
    spec = json.loads((folder / SPEC_FILE).read_text())
    torch.set_num_threads(spec["threads"])
    cfg, task, model = build_task_and_model(spec)
    load_into_fairseq(model, torch.load(folder / WEIGHTS_FILE, weights_only=True))
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    pad = task.target_dictionary.pad()
    updates = torch.load(folder / BATCHES_FILE, weights_only=True)
    record, snapshots = [], {}
    for number, batches in enumerate(updates, start=1):
        lr = trainer.get_lr()  # builds the optimizer and scheduler on first use
        with metrics.aggregate(new_root=True) as aggregated:
            trainer.train_step([fairseq_sample(batch, pad) for batch in batches])
        values = aggregated.get_smoothed_values()
        record.append({"update": number, "lr": lr, "loss": float(values["loss"]) * math.log(2),
                       "grad_norm": float(values["gnorm"])})  # fmt: skip
        if number in spec["snapshots"]:
            snapshots[number] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    (folder / RECORD_FILE).write_text(json.dumps(record) + "\n")
    torch.save(snapshots, folder / SNAPSHOTS_FILE)


# ---------------------------------------------------------------- the client (our venv)


def our_rate(cfg, step: int) -> float:
    """Our learning rate at update `step`: section 5.3's equation, which training multiplies
    by `train.cooldown_steps`' scale only in its last updates."""
    from pipeline.training.module import inverse_sqrt_rate

    t = cfg.train
    return inverse_sqrt_rate(step, d_model=cfg.model.d_model, warmup_steps=t.warmup_steps,
                             factor=t.lr_factor)  # fmt: skip


def fairseq_flags_for(cfg, warmup_init_lr: float) -> list[str]:
    """fairseq-train's flags for the recipe of `cfg` (sizes, dropouts, Adam, clipping, the
    warm-up schedule and label smoothing), as benchmarks.fairseq.train_peer passes them."""
    from benchmarks.fairseq import train_peer
    from benchmarks.train_throughput import fairseq_flags

    t = cfg.train
    peak = our_rate(cfg, t.warmup_steps)
    schedule = {
        "--lr-scheduler": "inverse_sqrt", "--lr": peak, "--warmup-updates": t.warmup_steps,
        "--warmup-init-lr": warmup_init_lr, "--clip-norm": t.gradient_clip_val or 0.0,
        "--weight-decay": t.weight_decay,
    }  # fmt: skip
    flags = fairseq_flags(cfg)
    flags[flags.index("--lr") : flags.index("--lr") + 2] = []  # the schedule's --lr instead
    return [*flags, *train_peer.flag_list(schedule)]


def our_updates(cfg, count: int) -> tuple[list[list[dict]], int]:
    """The first `count` updates of the run's training order (lists of batches; epoch after
    epoch, as training draws them), and the vocabulary size."""
    from pipeline.data.datamodule import TranslationDataModule

    data = TranslationDataModule(cfg)
    data.setup("fit")
    loader = data.train_dataloader()
    per_update = cfg.train.accumulate_grad_batches
    updates, current, epoch = [], [], 0
    while len(updates) < count:
        data.train_sampler.set_epoch(epoch)
        for batch in loader:
            current.append(batch)
            if len(current) == per_update:
                updates.append(current)
                current = []
                if len(updates) == count:
                    break
        epoch += 1
    return updates, data.vocab_size


def train_ours(cfg, vocab_size: int, initial: dict, updates: list[list[dict]], snapshots):
    """Our module through a real Lightning Trainer over exactly these batches."""
    import lightning as L
    from torch.utils.data import DataLoader

    from pipeline.training.module import TranslationModule

    class Recorder(L.Callback):
        """Per optimizer step of ours: the lr, the loss per target token, the normalised
        gradient norm; the weights at the snapshot updates."""

        def __init__(self) -> None:
            self.record, self.weights = [], {}
            self._loss_sum, self._tokens = 0.0, 0

        def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
            # Called before the module's own hook divides by the update's target tokens.
            norms = [p.grad.norm() for p in module.parameters() if p.grad is not None]
            scale = 1.0 / max(module._update_tokens, 1)
            self.record.append({"lr": optimizer.param_groups[0]["lr"],
                                "grad_norm": float(torch.stack(norms).norm()) * scale})  # fmt: skip

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            # Lightning hands back what training_step returned over the batches per update:
            # the batch's summed loss (module.training_step)
            self._loss_sum += float(outputs["loss"])
            self._tokens += int(batch["num_tgt_tokens"])
            if (batch_idx + 1) % trainer.accumulate_grad_batches:
                return
            number = trainer.global_step
            self.record[-1].update(update=number, loss=self._loss_sum / self._tokens,
                                   target_tokens=self._tokens)  # fmt: skip
            self._loss_sum, self._tokens = 0.0, 0
            if number in snapshots:
                state = module.model.state_dict()
                self.weights[number] = {k: v.detach().clone() for k, v in state.items()}

    module = TranslationModule(cfg, vocab_size)
    module.model.load_state_dict(initial)
    recorder = Recorder()
    # as pipeline.training.trainer.build_trainer sets these
    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=len(updates),
        accumulate_grad_batches=cfg.train.accumulate_grad_batches,
        gradient_clip_val=cfg.train.gradient_clip_val or None, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[recorder],
    )  # fmt: skip
    batches = [batch for update in updates for batch in update]
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))  # as they are
    return recorder.record, recorder.weights


def weights_apart(ours: dict, theirs: dict) -> dict:
    """Over all tensors: the largest |ours - fairseq| relative to that tensor's largest weight,
    ||ours - fairseq|| / ||fairseq|| and ||ours - fairseq|| over everything."""
    worst, diff_sq, norm_sq = 0.0, 0.0, 0.0
    for name, tensor in theirs.items():
        if name not in ours:  # fairseq's buffers (versions, positions' placeholders)
            continue
        difference = (ours[name] - tensor).abs()
        worst = max(worst, float(difference.max() / tensor.abs().max().clamp(min=1e-12)))
        diff_sq += float(difference.pow(2).sum())
        norm_sq += float(tensor.pow(2).sum())
    return {"max_relative": worst, "relative_norm": math.sqrt(diff_sq / norm_sq),
            "difference_norm": math.sqrt(diff_sq)}  # fmt: skip


def lockstep(
    cfg,
    count: int,
    *,
    venv: Path,
    threads: int,
    warmup_init_lr: float | None,
    snapshots: Sequence[int] | None = None,
) -> dict:
    """`count` updates of both from the same weights; the weights are compared after the
    `snapshots` updates (by default `snapshot_updates(count)`)."""
    import copy

    from benchmarks.fairseq.decode_checkpoint import (
        fairseq_positions,
        fairseq_state_dict,
        run_worker,
    )
    from benchmarks.fairseq.train_peer import build_parser
    from benchmarks.train_throughput import special_ids
    from pipeline.model.transformer import Transformer

    cfg = copy.deepcopy(cfg)
    cfg.model.dropout = 0.0  # masks cannot be shared between the two
    cfg.train.compile = False
    cfg.runtime.compile_loss = False
    torch.set_num_threads(threads)
    updates, vocab_size = our_updates(cfg, count)
    torch.manual_seed(cfg.seed)
    initial = Transformer(cfg.model, vocab_size, cfg.data.tokenizer.pad_id)
    marks = sorted(snapshots) if snapshots is not None else snapshot_updates(count)
    tokens, special = cfg.data.tokenizer, special_ids(cfg.data.tokenizer)
    harness_lr = build_parser().get_default("warmup_init_lr")  # where train_peer starts warm-up
    start_lr = harness_lr if warmup_init_lr is None else warmup_init_lr
    with tempfile.TemporaryDirectory(prefix="fairseq-lockstep-") as scratch:
        folder = Path(scratch)
        spec = {"flags": fairseq_flags_for(cfg, start_lr), "vocab_size": vocab_size,
                "special_ids": special, "threads": threads, "snapshots": marks}  # fmt: skip
        (folder / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        torch.save({"state_dict": fairseq_state_dict(initial),
                    "positions": fairseq_positions(initial, tokens.pad_id)},
                   folder / WEIGHTS_FILE)  # fmt: skip
        torch.save([[{k: b[k] for k in BATCH_KEYS} for b in update] for update in updates],
                   folder / BATCHES_FILE)  # fmt: skip
        run_worker(venv, folder, module="benchmarks.fairseq.lockstep_check")
        theirs = json.loads((folder / RECORD_FILE).read_text())
        their_weights = torch.load(folder / SNAPSHOTS_FILE, weights_only=True)
    ours, our_weights = train_ours(cfg, vocab_size, initial.state_dict(), updates, marks)
    rows = []
    for mine, other in zip(ours, theirs):
        row = {"update": mine["update"], "target_tokens": mine["target_tokens"],
               **{f"{key}_ours": mine[key] for key in ("lr", "loss", "grad_norm")},
               **{f"{key}_fairseq": other[key] for key in ("lr", "loss", "grad_norm")}}  # fmt: skip
        if row["update"] in our_weights:
            holder = copy.deepcopy(initial)
            holder.load_state_dict(our_weights[row["update"]])
            row["weights_apart"] = weights_apart(fairseq_state_dict(holder),
                                                 their_weights[row["update"]])  # fmt: skip
        rows.append(row)
    return {"updates": count, "vocab_size": vocab_size, "warmup_init_lr_fairseq": start_lr,
            "rows": rows}  # fmt: skip


def lockstep_table(result: dict) -> str:
    lines = [
        "update  lr ours    lr fairseq  loss ours  loss fs  gnorm ours  gnorm fs  weights apart"
    ]
    for row in result["rows"]:
        apart = row.get("weights_apart")
        text = f"{apart['relative_norm']:.2e} (max {apart['max_relative']:.2e})" if apart else ""
        lines.append(
            f"{row['update']:>6}  {row['lr_ours']:.3e}  {row['lr_fairseq']:.3e}  "
            f"{row['loss_ours']:9.4f}  {row['loss_fairseq']:7.4f}  {row['grad_norm_ours']:10.4f}"
            f"  {row['grad_norm_fairseq']:8.4f}  {text}"
        )
    return "\n".join(lines)


BLOCK = "lockstep"  # the diagnostics README's generated table


def markdown(paths: Sequence[Path]) -> str:
    """For each committed result: how fairseq's warm-up started, and its updates at the
    snapshot marks (where the weights were compared) side by side."""
    lines = []
    for path in paths:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        lines += [
            f"`{Path(path).name}`: {result['updates']} updates, fairseq's warm-up from "
            f"{result['warmup_init_lr_fairseq']:.3g} ({result['provenance']['hardware']}, "
            f"commit {result['provenance']['commit']})",
            "",
            "| update | lr ours | lr fairseq | loss ours | loss fairseq | grad norm ours "
            "| grad norm fairseq | weights apart, ‖ours - fairseq‖ / ‖fairseq‖ |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in result["rows"]:
            if "weights_apart" not in row:
                continue
            lines.append(
                f"| {row['update']} | {row['lr_ours']:.3e} | {row['lr_fairseq']:.3e} "
                f"| {row['loss_ours']:.4f} | {row['loss_fairseq']:.4f} "
                f"| {row['grad_norm_ours']:.3f} | {row['grad_norm_fairseq']:.3f} "
                f"| {row['weights_apart']['relative_norm']:.1e} |"
            )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks.fairseq.train_peer import DEFAULT_VENV

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the result JSON (a run)")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="RESULT",
                        help="no run: print (or with --update-readme write) these results' table")  # fmt: skip
    parser.add_argument("--update-readme", type=Path, metavar="README")
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--warmup-init-lr-as-ours", action="store_true")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser.parse_args(argv)


def cli(argv: Sequence[str] | None = None) -> None:
    from pipeline import config, docs_blocks
    from pipeline.atomic import write_json_atomic
    from pipeline.environment import provenance

    args = parse_args(argv)
    if args.summarize:
        block = markdown(args.summarize)
        if args.update_readme:
            docs_blocks.fill(args.update_readme, BLOCK, block)
        print(block, end="")
        return
    if args.out is None:
        raise SystemExit("--out RESULT.json is needed for a run (or --summarize RESULT ...)")
    made_with = provenance()  # at the start: commits made while it runs are not its code
    cfg = config.load()
    ours_first = our_rate(cfg, 1)
    result = lockstep(cfg, args.updates, venv=args.venv, threads=args.threads,
                      warmup_init_lr=ours_first if args.warmup_init_lr_as_ours else None)  # fmt: skip
    result["provenance"] = made_with
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    print(lockstep_table(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(Path(sys.argv[2]))
    else:
        from pipeline.cli import main

        main(cli)
