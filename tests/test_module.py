"""The training objective (5.4), the schedule (5.3), val BLEU, and the module's resume state."""

from __future__ import annotations

import pytest
import sacrebleu

from pipeline.rounding import FP32_EPS, float32_tolerance
from pipeline.training.module import (
    CorpusBleu,
    TokenMean,
    TranslationModule,
    cooldown_scale,
    inverse_sqrt_rate,
)
from tests.conftest import split_loss


def test_schedule_values_at_chosen_steps():
    # Equation (3) with d_model=512, warmup 4000 (the paper's base model).
    rate = lambda s: inverse_sqrt_rate(s, d_model=512, warmup_steps=4000, factor=1.0)  # noqa: E731
    assert rate(1) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert rate(2000) == pytest.approx(512**-0.5 * 2000 * 4000**-1.5)  # linear warmup
    peak = 512**-0.5 * 4000**-0.5
    assert rate(4000) == pytest.approx(peak)  # both branches meet at the warmup step
    assert max(rate(s) for s in range(1, 20000, 7)) <= peak * (1 + 1e-12)
    assert rate(16000) == pytest.approx(peak / 2)  # 4x the steps -> half the rate
    assert inverse_sqrt_rate(100, d_model=128, warmup_steps=50, factor=2.0) == pytest.approx(
        2.0 * 128**-0.5 * 100**-0.5
    )


def test_optimizer_follows_the_schedule_per_step(make_config):
    cfg = make_config("model.d_model=32", "model.heads=2", "model.d_ff=64",
                      "model.encoder_layers=1", "model.decoder_layers=1",
                      "train.warmup_steps=10", "train.lr_factor=2.0",
                      "train.adam_betas=[0.9,0.98]", "train.adam_eps=1e-9")  # fmt: skip
    module = TranslationModule(cfg, vocab_size=30)
    setup = module.configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    assert setup["lr_scheduler"]["interval"] == "step"
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    seen = []
    for _ in range(30):
        seen.append(optimizer.param_groups[0]["lr"])  # the lr the next optimizer step uses
        optimizer.step()
        scheduler.step()
    expected = [2.0 * 32**-0.5 * min(s**-0.5, s * 10**-1.5) for s in range(1, 31)]
    assert seen == pytest.approx(expected)
    assert max(seen) == pytest.approx(seen[9])  # the peak is at step = warmup


def test_cooldown_scales_the_last_steps_linearly_to_zero(make_config):
    assert [cooldown_scale(s, max_steps=10, cooldown_steps=4) for s in range(1, 11)] == (
        pytest.approx([1, 1, 1, 1, 1, 1, 1.0, 0.75, 0.5, 0.25])
    )
    assert cooldown_scale(10, max_steps=10, cooldown_steps=0) == 1.0
    cfg = make_config("model.d_model=32", "model.heads=2", "model.d_ff=64",
                      "model.encoder_layers=1", "model.decoder_layers=1",
                      "train.warmup_steps=10", "train.lr_factor=2.0",
                      "train.max_steps=30", "train.cooldown_steps=8")  # fmt: skip
    setup = TranslationModule(cfg, vocab_size=30).configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(30):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    paper = [2.0 * 32**-0.5 * min(s**-0.5, s * 10**-1.5) for s in range(1, 31)]
    assert seen[:22] == pytest.approx(paper[:22])  # equation (3) until the cool-down
    remaining = [(30 - s + 1) / 8 for s in range(23, 31)]  # 8/8 ... 1/8
    assert seen[22:] == pytest.approx([p * r for p, r in zip(paper[22:], remaining)])
    assert seen[-1] == pytest.approx(paper[-1] / 8)


def test_corpus_bleu_metric_equals_sacrebleu_over_batches():
    hypotheses = ["A man is riding a red bike .", "Two dogs play in the snow",
                  "a woman", "Ein Mann fährt Fahrrad ."]  # fmt: skip
    references = ["A man rides a red bicycle .", "Two dogs are playing in the snow .",
                  "A woman sings on a stage .", "Ein Mann fährt ein Fahrrad ."]  # fmt: skip
    metric = CorpusBleu()
    metric.update(hypotheses[:1], references[:1])
    metric.update(hypotheses[1:], references[1:])
    expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
    # sacrebleu's own float64 score of the same statistics, returned as a float32 tensor: one
    # rounding, eps / 2 relative.
    assert metric.compute().item() == pytest.approx(expected, rel=FP32_EPS)
    metric.reset()
    metric.update(["x y z"], ["a b c"])  # no n-gram matches at all
    assert metric.compute().item() == pytest.approx(
        sacrebleu.corpus_bleu(["x y z"], [["a b c"]]).score, rel=FP32_EPS
    )
    lowercase = CorpusBleu(lowercase=True)
    lowered = [h.lower() for h in hypotheses]  # a case-folded model's output
    lowercase.update(lowered, references)
    expected_lc = sacrebleu.corpus_bleu(lowered, [references], lowercase=True).score
    assert lowercase.compute().item() == pytest.approx(expected_lc, rel=FP32_EPS)
    assert expected_lc > sacrebleu.corpus_bleu(lowered, [references]).score + 5


def test_case_folded_model_scores_val_bleu_ignoring_case(make_config):
    for case_fold in (False, True):
        cfg = make_config(f"data.tokenizer.case_fold={str(case_fold).lower()}")
        module = TranslationModule(cfg, vocab_size=40)
        module.val_bleu.update(["a man rides ."], ["A man rides ."])
        assert (module.val_bleu.compute().item() == pytest.approx(100.0)) is case_fold


def test_module_saves_its_config_and_rebuilds_from_hyperparameters(make_config):
    cfg = make_config("model.d_model=32", "model.heads=2", "model.d_ff=64",
                      "model.encoder_layers=1", "model.decoder_layers=1")  # fmt: skip
    module = TranslationModule(cfg, vocab_size=40)
    assert module.hparams["vocab_size"] == 40
    assert module.hparams["config"]["model"]["d_model"] == 32
    rebuilt = TranslationModule(**module.hparams)
    assert rebuilt.cfg == cfg
    assert rebuilt.model.num_parameters() == module.model.num_parameters()
    # Checkpoints hold the Transformer once, under `model.` (what averaging and eval load).
    assert module.state_dict().keys() == {f"model.{k}" for k in module.model.state_dict()}


@pytest.mark.parametrize("cpu_speed_paths", [True, False])
def test_module_builds_the_speed_paths_its_config_names(make_config, cpu_speed_paths):
    """runtime.cpu_speed_paths reaches every dropout and attention layer of the model, and a
    module rebuilt from its saved hyperparameters (a resumed run) builds the same paths;
    off, every dropout is torch.nn.Dropout with model.dropout as given."""
    from torch import nn

    from pipeline.kernels import SpeedPaths, speed_paths_of
    from pipeline.kernels.cpu_dropout import CpuDropout
    from pipeline.model.attention import MultiHeadAttention

    cfg = make_config("model.d_model=32", "model.heads=2", "model.d_ff=64",
                      "model.encoder_layers=1", "model.decoder_layers=1", "model.dropout=0.3",
                      f"runtime.cpu_speed_paths={str(cpu_speed_paths).lower()}")  # fmt: skip
    expected = SpeedPaths.on_cpu(cpu_speed_paths)
    dropout_type = CpuDropout if cpu_speed_paths else nn.Dropout
    for module in (
        TranslationModule(cfg, 40),
        TranslationModule(**TranslationModule(cfg, 40).hparams),
    ):
        layers = list(module.model.modules())
        dropouts = [m for m in layers if isinstance(m, (nn.Dropout, CpuDropout))]
        assert len(dropouts) == 1 + 2 * 1 + 3 * 1 + 2  # embeddings, residuals, FFN activations
        assert all(type(m) is dropout_type for m in dropouts)
        assert module.model.dropout.p == 0.3
        attention = [m for m in layers if isinstance(m, MultiHeadAttention)]
        assert len(attention) == 3 and speed_paths_of(module.model) == expected


def test_token_mean_weighs_each_value_by_its_tokens():
    import torch
    from torchmetrics import MeanMetric

    values, tokens = [1.0, 3.0, 2.0], [1, 3, 6]
    ours, reference = TokenMean(), MeanMetric(nan_strategy="warn")  # "warn" keeps the weights
    for value, count in zip(values, tokens):
        ours.update(torch.tensor(value), weight=count)
        reference.update(torch.tensor(value), weight=count)
    expected = sum(v * n for v, n in zip(values, tokens)) / sum(tokens)  # 2.2, not the plain 2.0
    assert ours.compute().item() == pytest.approx(expected) == reference.compute().item()


def test_val_loss_is_the_mean_over_the_splits_tokens(trained_smoke):
    """val/loss is the loss per target token of the whole split, not the mean of its batches'
    means (what torchmetrics' MeanMetric(nan_strategy="disable") logged)."""
    import copy
    from pathlib import Path

    import lightning as L

    from pipeline.data.datamodule import TranslationDataModule

    cfg = copy.deepcopy(trained_smoke)
    cfg.eval.max_tokens = 120  # many batches, of unequal token counts
    checkpoint = Path(cfg.paths.train_dir) / "checkpoints" / "last.ckpt"
    module = TranslationModule.load_from_checkpoint(checkpoint, map_location="cpu")
    module.cfg.train.val_bleu = False  # the loss alone (BLEU needs the references attached)
    data = TranslationDataModule(cfg)
    data.setup("validate")
    loader = data.val_dataloader()
    per_token, batch_means = split_loss(module, loader)
    assert abs(per_token - batch_means) > 1e-3  # the two means differ here: the test can fail
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    (logged,) = trainer.validate(module, dataloaders=loader, verbose=False)
    # The same per-batch loss sums; val/loss divides and multiplies each by its token count
    # and adds them up in float32, split_loss in float64.
    tolerance = float32_tolerance(len(loader) + 2, per_token)
    assert logged["val/loss"] == pytest.approx(per_token, abs=tolerance)
