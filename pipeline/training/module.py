"""The training objective and its metrics: sections 5.3 (optimizer, schedule), 5.4 (label
smoothing), the losses every run logs and validation BLEU. Token counts, throughput and wall
time are measured beside it (`pipeline.training.throughput`).

    loss  = sum_t [(1 - eps) * -log p(y_t) + eps * (1/V) sum_v -log p(v)] / #tokens   (5.4)
    lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)                 (5.3, eq. 3)
            * min(1, (max_steps - step + 1) / cooldown)        (optional linear cool-down)

Padding positions of the target carry no loss. Metrics are token-weighted torchmetrics
aggregates, so they are exact across batches and reduced across DDP ranks on `compute()`.

An update of several batches (gradient accumulation, DDP ranks) averages its batches' losses
(`train.loss_normalization: batch`), or, as fairseq does, divides the loss summed over all its
target tokens by their number (`update`: each token weighs the same, whatever its batch holds).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
from sacrebleu.metrics.bleu import BLEU, MAX_NGRAM_ORDER
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torchmetrics import MeanMetric, Metric

from pipeline.config import from_dict, to_dict
from pipeline.config_schema import Config
from pipeline.data.batching import eval_batches
from pipeline.errors import ConfigError, PipelineError
from pipeline.evaluation.scoring import bleu_from_statistics, sentence_bleu_statistics
from pipeline.kernels import SpeedPaths, install_speed_paths
from pipeline.metric_names import GREEDY_VAL_BLEU, current_names
from pipeline.model.decoding import greedy_decode
from pipeline.model.transformer import build_transformer
from pipeline.training.checkpoints import PRECISION_KEY, SOURCE_HASH_KEY, WORLD_SIZE_KEY
from pipeline.training.loss import output_layer_loss
from pipeline.training.preemption import PreemptionCallback

# The running means of the logging window (train.log_every_n_steps), saved in checkpoints.
TRAIN_WINDOW_METRICS = ("train_loss", "train_nll")
# sacrebleu's BLEU sufficient statistics: hyp_len, ref_len, 4 x n-gram matches, 4 x n-gram totals.
BLEU_STATS = 2 + 2 * MAX_NGRAM_ORDER


class DivergedError(PipelineError):
    """The training loss became NaN or infinite."""


def inverse_sqrt_rate(step: int, *, d_model: int, warmup_steps: int, factor: float) -> float:
    """Section 5.3, equation (3): linear warmup, then decay with the inverse square root of
    the step. `step` counts optimizer steps from 1."""
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown_scale(step: int, *, max_steps: int, cooldown_steps: int) -> float:
    """Not in the paper: the last `cooldown_steps` optimizer steps of a fixed budget scale the
    rate linearly down to 0 (1 before them, 1/cooldown_steps at the last step; 0 steps: always
    1). A run that ends on a decayed rate reaches a lower loss than one cut off mid-schedule
    (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations"). `step` counts from 1."""
    if cooldown_steps == 0:
        return 1.0
    return min(1.0, (max_steps - step + 1) / cooldown_steps)


class TokenMean(MeanMetric):
    """The mean of per-token values weighted by their token counts, summed over DDP ranks,
    without a host sync per update. torchmetrics' `MeanMetric(nan_strategy="disable")` (the
    no-sync setting) replaces the weights with ones (torchmetrics 1.9.0;
    Lightning-AI/torchmetrics#3434), which made val/loss the plain mean of its batches' means:
    the few long sentences of the last batch weighed as much as a full batch. Same states as
    `MeanMetric` (`mean_value`, `weight`), so checkpoints' logging windows still restore."""

    def __init__(self) -> None:
        super().__init__(nan_strategy="disable")

    def update(self, value: Tensor, weight: float | Tensor) -> None:
        value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        weight = torch.as_tensor(weight, dtype=self.dtype, device=self.device)
        weight = torch.broadcast_to(weight, value.shape)
        self.mean_value += (value * weight).sum()
        self.weight += weight.sum()


class CorpusBleu(Metric):
    """Corpus BLEU exactly as `sacrebleu.corpus_bleu` computes it (13a tokenisation, exp
    smoothing), accumulated as sacrebleu's sufficient statistics so that it sums over batches
    and DDP ranks. `lowercase`: sacreBLEU's -lc (a model trained on case-folded text)."""

    full_state_update = False

    def __init__(self, lowercase: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self._bleu = BLEU(lowercase=lowercase)
        self.add_state("stats", default=torch.zeros(BLEU_STATS, dtype=torch.float64),
                       dist_reduce_fx="sum")  # fmt: skip

    def update(self, hypotheses: Sequence[str], references: Sequence[str]) -> None:
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
        if not hypotheses:
            return
        per_sentence = sentence_bleu_statistics(self._bleu, hypotheses, references)
        self.stats += torch.tensor(per_sentence, dtype=torch.float64).sum(0).to(self.stats.device)

    def compute(self) -> Tensor:
        score = bleu_from_statistics(self._bleu, self.stats.tolist())
        return torch.tensor(score, dtype=torch.float32)


def _rng_states() -> dict:
    """The random streams dropout and data code draw from, as plain types and tensors (so
    checkpoints load with `torch.load(weights_only=True)`)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss,
                  cached_gaussian],
        "python": random.getstate(),
    }  # fmt: skip
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss,
                         cached_gaussian))  # fmt: skip
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class TranslationModule(L.LightningModule):
    """The Transformer trained with label-smoothed cross-entropy, Adam and the warmup schedule.

    `config` is a `Config` (or the dict `to_dict` made of one: how `load_from_checkpoint`
    rebuilds the module from the saved hyperparameters `config` and `vocab_size`).
    """

    def __init__(self, config: Config | dict, vocab_size: int) -> None:
        super().__init__()
        cfg = from_dict(config) if isinstance(config, dict) else config
        # logger=False: W&B gets the full config once, from `pipeline.tracking`.
        self.save_hyperparameters({"config": to_dict(cfg), "vocab_size": vocab_size},
                                  logger=False)  # fmt: skip
        self.cfg = cfg
        special = cfg.data.tokenizer
        self.pad_id, self.bos_id, self.eos_id = special.pad_id, special.bos_id, special.eos_id
        # runtime.cpu_speed_paths: a host choice that changes dropout's mask stream, so it is
        # part of the saved config and a resumed run keeps it.
        model = build_transformer(cfg, vocab_size)
        self.model = install_speed_paths(model, SpeedPaths.on_cpu(cfg.runtime.cpu_speed_paths))
        # train.compile: a compiled forward function (not a module, so the state_dict keys
        # stay `model.*`); the plain module otherwise.
        compiled = torch.compile(self.model.teacher_forced_states) if cfg.train.compile else None
        self._forward = compiled

        # Token-weighted, no host sync per update; divergence is tracked separately.
        self.train_loss = TokenMean()
        self.train_nll = TokenMean()
        self.val_loss = TokenMean()
        self.val_nll = TokenMean()
        # A case-folded model writes lowercase: its val/greedy_bleu (checkpoint ranking, early
        # stopping, sweeps) ignores case, or every capital in the references would count.
        self.val_bleu = CorpusBleu(lowercase=special.case_fold)

        # Validation references and the detokenizer, attached by `attach_references`.
        self.tokenizer = None
        self.val_references: Sequence[str] | None = None
        self._bleu_sources: list[tuple[int, Tensor]] = []  # (sentence id, source ids)

        # Learning curves and val results so far; saved in checkpoints (a resumed run keeps them).
        self.history: list[dict] = []
        self._first_nonfinite_step: Tensor | None = None  # device scalar; -1 while all finite
        self._update_tokens = 0  # target tokens of the update being accumulated (this rank)
        self._rng_to_restore: dict | None = None
        self._window_to_restore: dict | None = None
        # Set by `trainer.run`: stops training on a preemption signal at the end of a step.
        self.preemption: PreemptionCallback | None = None
        self._last_step = 0
        self._step_lr = 0.0
        self.source_hash: str | None = None  # set by trainer.run; saved in checkpoints

    # ------------------------------------------------------------------ set-up

    def attach_references(self, tokenizer, val_references: Sequence[str]) -> None:
        """What val/greedy_bleu needs: a tokenizer to detokenize hypotheses, and the validation
        split's reference sentences indexed by the batches' `ids`."""
        self.tokenizer = tokenizer
        self.val_references = val_references

    def configure_optimizers(self):
        t = self.cfg.train
        # LambdaLR multiplies the base lr (1.0) by the whole rate of equation (3).
        optimizer = torch.optim.Adam(
            self.parameters(),
            lr=1.0,
            betas=tuple(t.adam_betas),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        d_model, warmup, factor = self.cfg.model.d_model, t.warmup_steps, t.lr_factor

        def rate(scheduler_steps: int) -> float:  # LambdaLR counts from 0, the paper from 1
            step = scheduler_steps + 1
            return inverse_sqrt_rate(
                step, d_model=d_model, warmup_steps=warmup, factor=factor
            ) * cooldown_scale(step, max_steps=t.max_steps, cooldown_steps=t.cooldown_steps)

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    # ------------------------------------------------------------------ training

    def _loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        states = (self._forward or self.model.teacher_forced_states)(
            batch["src"], batch["tgt_in"]
        )  # (B, T, d_model)
        loss_sum, nll_sum = output_layer_loss(
            states, self.model.output_projection, batch["tgt_out"],
            epsilon=self.cfg.train.label_smoothing, pad_id=self.pad_id,
            chunk_rows=self.cfg.runtime.loss_chunk_rows, compiled=self.cfg.runtime.compile_loss,
        )  # fmt: skip
        return loss_sum, nll_sum, int(batch["num_tgt_tokens"])

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        self._step_lr = self.trainer.optimizers[0].param_groups[0]["lr"]  # the lr of this step
        loss_sum, nll_sum, num_tokens = self._loss(batch)
        loss = loss_sum / num_tokens
        self.train_loss.update(loss.detach(), weight=num_tokens)
        self.train_nll.update(nll_sum.detach() / num_tokens, weight=num_tokens)
        self._track_nonfinite(loss.detach())
        if self.cfg.train.loss_normalization == "update":
            # The summed loss: Lightning divides what this returns by the batches per update,
            # undone here; `on_before_optimizer_step` divides by the update's tokens.
            self._update_tokens += num_tokens
            return loss_sum * self.trainer.accumulate_grad_batches
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Under `loss_normalization: update`, the accumulated gradient of the summed loss over
        the update's target tokens on every rank (DDP averaged the ranks: times their number),
        before clipping, as fairseq's `multiply_grads(1 / sample_size)`."""
        if self.cfg.train.loss_normalization != "update":
            return
        tokens = torch.tensor(float(self._update_tokens), device=self.device)
        if self.trainer.world_size > 1:
            tokens = self.trainer.strategy.reduce(tokens, reduce_op="sum")
        scale = self.trainer.world_size / tokens.clamp(min=1.0)
        # one fused multiply over all gradients, not a kernel per parameter
        torch._foreach_mul_([p.grad for p in self.parameters() if p.grad is not None], scale)
        self._update_tokens = 0

    def _track_nonfinite(self, loss: Tensor) -> None:
        """Remember the first step whose loss was NaN/inf, on the device (no host sync)."""
        if self._first_nonfinite_step is None:
            self._first_nonfinite_step = torch.full((), -1, dtype=torch.long, device=loss.device)
        step = self.trainer.global_step + 1  # the optimizer step this batch contributes to
        first_bad = ~torch.isfinite(loss) & self._first_nonfinite_step.lt(0)
        self._first_nonfinite_step = torch.where(
            first_bad, torch.full_like(self._first_nonfinite_step, step), self._first_nonfinite_step
        )

    def check_finite(self) -> None:
        """Raise `DivergedError` naming the step if any rank saw a NaN/inf loss (one sync)."""
        if self._first_nonfinite_step is None:
            return
        bad_steps = self.all_gather(self._first_nonfinite_step).reshape(-1)
        if bad_steps.max().item() < 0:
            return
        step = int(bad_steps[bad_steps.ge(0)].min().item())
        saved = [getattr(c, "last_model_path", "") for c in self.trainer.checkpoint_callbacks]
        last = next(filter(None, saved), "none yet")  # the callback that writes last.ckpt
        raise DivergedError(
            f"training diverged: train/loss became NaN/inf at step {step}. "
            f"The last good checkpoint is {last}. Lower train.lr_factor, raise "
            "train.warmup_steps or set train.gradient_clip_val, then run again."
        )

    def on_train_start(self) -> None:
        self._last_step = self.trainer.global_step
        if self._window_to_restore is not None:  # the metrics are on their device by now
            self._restore_logging_window(self._window_to_restore)
            self._window_to_restore = None

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # Resume: continue the random streams (dropout) exactly where the checkpoint left
        # them. Not earlier: starting a DataLoader iterator draws a seed from the global RNG,
        # and the resumed run starts one (mid-epoch) where the uninterrupted run did not.
        if self._rng_to_restore is not None:
            _set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step = self.trainer.global_step
        stepped, self._last_step = step != self._last_step, step  # not while accumulating
        if stepped and step % self.trainer.log_every_n_steps == 0:
            self._log_train_window(step)
        if stepped and self.preemption is not None:  # last: the step's bookkeeping is done
            self.preemption.at_step_end(self.trainer)

    def _log_train_window(self, step: int) -> None:
        self.check_finite()
        train_loss, train_nll = self.train_loss.compute(), self.train_nll.compute()  # synced
        lr = self._step_lr
        self.log_dict(
            {"train/loss": train_loss, "train/nll_loss": train_nll, "train/ppl": train_nll.exp()},
            on_step=True,
            on_epoch=False,
        )
        # "step" is the loggers' x axis: optimizer steps done, as in checkpoint names.
        self.log_dict({"lr": lr, "step": float(step)}, on_step=True, on_epoch=False)
        self.history.append({"step": step, "train/loss": train_loss.item(), "lr": lr})
        self.train_loss.reset()
        self.train_nll.reset()

    def on_train_end(self) -> None:
        self.check_finite()

    # ------------------------------------------------------------------ validation

    def on_validation_end(self) -> None:
        if self.preemption is not None:  # after the checkpoint callbacks saved this step
            self.preemption.after_validation(self.trainer)

    def on_validation_epoch_start(self) -> None:
        self._bleu_sources = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # The evaluation loader gives every rank the whole split: each takes its share of the
        # batches, and the metrics' compute() sums the shares.
        if batch_idx % self.trainer.world_size != self.trainer.global_rank:
            return
        loss_sum, nll_sum, num_tokens = self._loss(batch)
        self.val_loss.update(loss_sum / num_tokens, weight=num_tokens)
        self.val_nll.update(nll_sum / num_tokens, weight=num_tokens)
        if self.cfg.train.val_bleu:
            self._collect_bleu_sources(batch)

    def _collect_bleu_sources(self, batch: dict) -> None:
        """Keep the sources of the first val_bleu_max_sentences sentences (all without a
        limit) for one batched greedy decode at the end of validation: decoding costs one
        model call per output position, so few large batches beat one per loader batch."""
        limit = self.cfg.train.val_bleu_max_sentences
        is_source = batch["src"].ne(self.pad_id)
        for row, sentence_id in enumerate(batch["ids"].tolist()):
            if limit is None or sentence_id < limit:
                self._bleu_sources.append((sentence_id, batch["src"][row][is_source[row]]))

    def _update_bleu(self) -> None:
        if self.tokenizer is None or self.val_references is None:
            raise RuntimeError(
                f"{GREEDY_VAL_BLEU} needs attach_references(tokenizer, references) first"
            )
        sources, e = self._bleu_sources, self.cfg.eval
        for indices in eval_batches([len(src) for _, src in sources], e.max_tokens):
            src = pad_sequence([sources[i][1] for i in indices], batch_first=True,
                               padding_value=self.pad_id)  # fmt: skip
            hypotheses = greedy_decode(
                self.model,
                src,
                bos_id=self.bos_id,
                eos_id=self.eos_id,
                max_len_a=e.max_len_a,
                max_len_b=e.max_len_b,
            )
            texts = [self.tokenizer.decode(tokens) for tokens in hypotheses]
            references = [self.val_references[sources[i][0]] for i in indices]
            self.val_bleu.update(texts, references)
        self._bleu_sources = []

    def on_validation_epoch_end(self) -> None:
        # compute() reduces over DDP ranks, so every rank logs the same value.
        val_loss, val_nll = self.val_loss.compute(), self.val_nll.compute()
        metrics = {"val/loss": val_loss, "val/nll_loss": val_nll, "val/ppl": val_nll.exp()}
        if self.cfg.train.val_bleu:
            self._update_bleu()
            metrics[GREEDY_VAL_BLEU] = self.val_bleu.compute().to(self.device)
        step = torch.tensor(float(self.trainer.global_step), device=self.device)
        self.log_dict({**metrics, "step": step}, on_step=False, on_epoch=True)
        for metric in (self.val_loss, self.val_nll, self.val_bleu):
            metric.reset()
        if not self.trainer.sanity_checking:
            record = {key: float(value) for key, value in metrics.items()}
            self.history.append({"step": self.trainer.global_step, **record})

    # ------------------------------------------------------------------ checkpoints

    def _logging_window(self) -> dict[str, dict[str, Tensor]]:
        """The train/loss and train/nll_loss sums of the steps since the last log, summed over
        ranks (every rank saves a checkpoint together): a run resumed inside a logging window
        logs what the uninterrupted run would."""
        window = {}
        for name in TRAIN_WINDOW_METRICS:
            states = getattr(self, name).metric_state
            window[name] = {
                key: self.trainer.strategy.reduce(value.detach().clone(), reduce_op="sum").cpu()
                for key, value in states.items()
            }
        return window

    def _restore_logging_window(self, window: dict[str, dict[str, Tensor]]) -> None:
        """Rank zero continues the saved window sums (the other ranks' shares are in them)."""
        for name in TRAIN_WINDOW_METRICS:
            metric = getattr(self, name)
            metric.reset()
            if name in window and self.global_rank == 0:
                metric.merge_state({k: v.to(self.device) for k, v in window[name].items()})

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.check_finite()  # raising here keeps the previous (good) checkpoint on disk
        checkpoint["history"] = self.history
        checkpoint["rng_states"] = _rng_states()
        checkpoint[SOURCE_HASH_KEY] = self.source_hash
        checkpoint["logging_window"] = self._logging_window()
        checkpoint[PRECISION_KEY] = self.trainer.precision  # what `auto` resolved to
        checkpoint[WORLD_SIZE_KEY] = self.trainer.world_size

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._check_world_size(checkpoint)
        self.history = [current_names(r) for r in checkpoint.get("history", [])]
        self._rng_to_restore = checkpoint.get("rng_states")
        self._window_to_restore = checkpoint.get("logging_window")

    def _check_world_size(self, checkpoint: dict) -> None:
        """A run continues on as many processes as it trained on: with `train.devices: auto` a
        resumed run (or a retried trial) on a machine of another GPU count would change its
        global batch (num_nodes x devices x max_tokens) mid-run. A finished run, only
        restored, may load anywhere."""
        try:
            trainer = self.trainer
        except RuntimeError:  # `load_from_checkpoint`: weights alone, no run continues
            return
        saved, now = checkpoint.get(WORLD_SIZE_KEY), trainer.world_size
        if saved is None or saved == now or 0 <= trainer.max_steps <= checkpoint["global_step"]:
            return
        raise ConfigError(
            f"config key 'train.devices': the run in {self.cfg.paths.train_dir} trained on "
            f"{saved} process(es) and would continue on {now} (train.num_nodes x "
            "train.devices), which changes its global batch mid-run: continue it on "
            f"{saved}, or train anew with train.resume=false (the run is moved aside, kept)"
        )

    # ------------------------------------------------------------------ summaries

    def val_records(self) -> list[dict]:
        return [r for r in self.history if "val/loss" in r]

    def best_val(self) -> dict | None:
        """The validation with the best val/greedy_bleu (or lowest val/loss without BLEU)."""
        records = self.val_records()
        if not records:
            return None
        if self.cfg.train.val_bleu:
            return max(records, key=lambda r: (r[GREEDY_VAL_BLEU], -r["step"]))
        return min(records, key=lambda r: (r["val/loss"], r["step"]))
