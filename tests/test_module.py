"""The training objective (5.4), the schedule (5.3), val BLEU, and the module's resume state."""

from __future__ import annotations

import numpy as np
import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from pipeline.training.module import (
    CorpusBleu,
    TranslationModule,
    inverse_sqrt_rate,
    label_smoothed_nll,
)

PAD = 0


def _random_batch(seed: int = 0, batch: int = 3, length: int = 7, vocab: int = 11):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=generator) * 3
    target = torch.randint(1, vocab, (batch, length), generator=generator)
    target[0, 4:] = PAD  # ragged rows, as in a padded batch
    target[2, 1:] = PAD
    return logits, target


def _numpy_reference(logits: torch.Tensor, target: torch.Tensor, eps: float):
    """Section 5.4 written out: an explicit smoothed target distribution per token."""
    z = logits.double().numpy()
    shifted = z - z.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    vocab = z.shape[-1]
    loss = nll = 0.0
    for b, t in zip(*np.nonzero(target.numpy() != PAD)):
        q = np.full(vocab, eps / vocab)
        q[target[b, t]] += 1.0 - eps
        loss += -(q * log_p[b, t]).sum()
        nll += -log_p[b, t, target[b, t]]
    return loss, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_an_explicit_target_distribution(eps):
    logits, target = _random_batch()
    loss, nll = label_smoothed_nll(logits, target, epsilon=eps, pad_id=PAD)
    ref_loss, ref_nll = _numpy_reference(logits, target, eps)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll, rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothing_matches_torch_cross_entropy_with_ignore_index(eps):
    # torch spreads eps uniformly over all V classes (gold included) and drops ignored tokens.
    logits, target = _random_batch(seed=1, vocab=50)
    loss, nll = label_smoothed_nll(logits, target, epsilon=eps, pad_id=PAD)
    flat_logits, flat_target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
    expected = F.cross_entropy(
        flat_logits, flat_target, ignore_index=PAD, label_smoothing=eps, reduction="sum"
    )
    expected_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected_nll)


def test_label_smoothing_gradient_matches_torch():
    logits, target = _random_batch(seed=2, vocab=20)
    ours = logits.clone().requires_grad_()
    theirs = logits.clone().requires_grad_()
    label_smoothed_nll(ours, target, epsilon=0.1, pad_id=PAD)[0].backward()
    F.cross_entropy(
        theirs.reshape(-1, 20), target.reshape(-1), ignore_index=PAD, label_smoothing=0.1,
        reduction="sum",
    ).backward()  # fmt: skip
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert ours.grad[2, 1:].abs().sum() == 0  # padding positions receive no gradient


def test_label_smoothing_is_fp32_under_bf16_logits():
    logits, target = _random_batch(seed=3)
    loss, _ = label_smoothed_nll(logits.bfloat16(), target, epsilon=0.1, pad_id=PAD)
    assert loss.dtype == torch.float32
    reference, _ = label_smoothed_nll(logits.bfloat16().float(), target, epsilon=0.1, pad_id=PAD)
    torch.testing.assert_close(loss, reference)


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


def test_corpus_bleu_metric_equals_sacrebleu_over_batches():
    hypotheses = ["A man is riding a red bike .", "Two dogs play in the snow",
                  "a woman", "Ein Mann fährt Fahrrad ."]  # fmt: skip
    references = ["A man rides a red bicycle .", "Two dogs are playing in the snow .",
                  "A woman sings on a stage .", "Ein Mann fährt ein Fahrrad ."]  # fmt: skip
    metric = CorpusBleu()
    metric.update(hypotheses[:1], references[:1])
    metric.update(hypotheses[1:], references[1:])
    expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert metric.compute().item() == pytest.approx(expected, abs=1e-4)
    metric.reset()
    metric.update(["x y z"], ["a b c"])  # no n-gram matches at all
    assert metric.compute().item() == pytest.approx(
        sacrebleu.corpus_bleu(["x y z"], [["a b c"]]).score, abs=1e-6
    )


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
