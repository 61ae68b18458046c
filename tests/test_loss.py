"""Section 5.4's loss: values against an explicit target distribution and torch's
cross-entropy, the hand-written gradients against autograd and finite differences, and the
fused output layer + loss against the plain logits path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.rounding import BF16_EPS, float32_tolerance
from pipeline.training import loss as loss_lib
from pipeline.training.loss import label_smoothed_nll, output_layer_loss

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
    # float32 against float64: per token a log-softmax normaliser and a smoothed sum (vocab
    # terms each, of the size of the logits), then a sum over the tokens.
    tokens, vocab = int(target.ne(PAD).sum()), logits.size(-1)
    tolerance = float32_tolerance(2 * vocab + tokens, tokens * float(logits.abs().max()))
    assert loss.item() == pytest.approx(ref_loss, abs=tolerance)
    assert nll.item() == pytest.approx(ref_nll, abs=tolerance)


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


def test_label_smoothing_backward_passes_gradcheck_through_both_outputs():
    # The hand-written backward against finite differences, in float64, with the loss and
    # the nll both feeding the result (as when a caller backpropagates through each).
    logits, target = _random_batch(seed=4, vocab=7)
    logits = logits.double().requires_grad_()

    def combined(z):
        loss, nll = label_smoothed_nll(z, target, epsilon=0.2, pad_id=PAD)
        return 0.7 * loss + 0.3 * nll

    assert torch.autograd.gradcheck(combined, (logits,))


def test_label_smoothing_is_fp32_under_bf16_logits():
    logits, target = _random_batch(seed=3)
    loss, _ = label_smoothed_nll(logits.bfloat16(), target, epsilon=0.1, pad_id=PAD)
    assert loss.dtype == torch.float32
    reference, _ = label_smoothed_nll(logits.bfloat16().float(), target, epsilon=0.1, pad_id=PAD)
    torch.testing.assert_close(loss, reference)


def _hidden_batch(seed: int, bias: bool, vocab: int = 13, d_model: int = 8):
    generator = torch.Generator().manual_seed(seed)
    _, target = _random_batch(seed=seed, vocab=vocab)
    hidden = torch.randn(*target.shape, d_model, generator=generator)
    layer = nn.Linear(d_model, vocab, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(vocab, d_model, generator=generator))
        if bias:
            layer.bias.copy_(torch.randn(vocab, generator=generator))
    return hidden, layer, target


@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_output_layer_loss_equals_logits_then_loss(chunk_rows, bias, compiled):
    hidden, layer, target = _hidden_batch(seed=5, bias=bias)
    reference_layer = nn.Linear(layer.in_features, layer.out_features, bias=bias)
    reference_layer.load_state_dict(layer.state_dict())
    h_ours = hidden.clone().requires_grad_()
    h_ref = hidden.clone().requires_grad_()

    loss, nll = output_layer_loss(
        h_ours, layer, target, epsilon=0.1, pad_id=PAD, chunk_rows=chunk_rows, compiled=compiled
    )
    ref_loss, ref_nll = label_smoothed_nll(reference_layer(h_ref), target, epsilon=0.1, pad_id=PAD)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    (0.5 * loss).backward()  # an upstream gradient other than 1 scales every gradient
    (0.5 * ref_loss).backward()
    torch.testing.assert_close(h_ours.grad, h_ref.grad)
    torch.testing.assert_close(layer.weight.grad, reference_layer.weight.grad)
    if bias:
        torch.testing.assert_close(layer.bias.grad, reference_layer.bias.grad)
    assert h_ours.grad[target.eq(PAD)].abs().sum() == 0  # padding rows get no gradient


def bf16_logit_rounding(hidden, layer, target) -> tuple[float, torch.Tensor]:
    """How far two bf16 autocast evaluations of the output layer + loss may lie apart: (the
    loss's bound, the weight gradient's bound per entry). Each side sums a logit's products in
    float32 in its own order, so the two may round it to neighbouring bf16 values: one bf16
    ulp, at most BF16_EPS |z|. The loss moves by (p - q) . dz per token (p the softmax, q the
    smoothed target). The weight gradient sums (p - q) h over the tokens; each side rounds
    p - q, h and the product to bf16 (BF16_EPS / 2 each) after its logits' rounding moved p
    (another BF16_EPS / 2): 2 BF16_EPS per side, 4 between the two, of sum |p - q| |h|."""
    real = target.ne(PAD)
    with torch.no_grad():
        logits = layer(hidden[real])
        q = torch.full_like(logits, 0.1 / logits.size(-1))
        q[torch.arange(len(q)), target[real]] += 0.9
        p_minus_q = logits.softmax(-1) - q
        loss_bound = BF16_EPS * float((p_minus_q.abs() * logits.abs()).sum())
        gradient_bound = 4 * BF16_EPS * (p_minus_q.abs().T @ hidden[real].abs())
    return loss_bound, gradient_bound


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_output_layer_loss_under_bf16_autocast_matches_autocast_linear(compiled):
    hidden, layer, target = _hidden_batch(seed=6, bias=False, vocab=64, d_model=32)
    h_ours = hidden.clone().requires_grad_()
    h_ref = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = output_layer_loss(
            h_ours, layer, target, epsilon=0.1, pad_id=PAD, chunk_rows=5, compiled=compiled
        )
        ref_loss, _ = label_smoothed_nll(layer(h_ref), target, epsilon=0.1, pad_id=PAD)
    assert loss.dtype == torch.float32 and layer.weight.dtype == torch.float32
    loss_bound, gradient_bound = bf16_logit_rounding(hidden, layer, target)
    torch.testing.assert_close(loss, ref_loss, atol=loss_bound, rtol=0)
    weight_grad = torch.autograd.grad(loss, layer.weight, retain_graph=True)[0]
    ref_weight_grad = torch.autograd.grad(ref_loss, layer.weight)[0]
    assert weight_grad.dtype == torch.float32
    assert ((weight_grad - ref_weight_grad).abs() <= gradient_bound).all()


def test_fused_output_layer_loss_without_grad_computes_only_the_loss():
    hidden, layer, target = _hidden_batch(seed=7, bias=False)
    with torch.no_grad():
        loss, _ = output_layer_loss(hidden, layer, target, epsilon=0.1, pad_id=PAD, chunk_rows=3)
        reference, _ = label_smoothed_nll(layer(hidden), target, epsilon=0.1, pad_id=PAD)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, reference)


def test_a_chunk_function_that_fails_to_compile_warns_and_runs_eagerly(caplog):
    logits = torch.randn(6, 13, generator=torch.Generator().manual_seed(8))
    target = torch.tensor([1, 4, 0, 12, 7, 7])
    chunk = loss_lib._CompiledChunk()

    def no_compiler(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    chunk.compiled = no_compiler
    with caplog.at_level("WARNING", logger=loss_lib.__name__):
        got = chunk(logits, target, 0.1, torch.float32)
        again = chunk(logits, target, 0.1, torch.float32)  # no second attempt, no second warning
    expected = loss_lib._chunk_loss_and_grad(logits, target, 0.1, torch.float32)
    for value in (got, again):
        for ours, reference in zip(value, expected, strict=True):
            torch.testing.assert_close(ours, reference)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "runtime.compile_loss" in warnings[0]
    assert "No working C++ compiler" in warnings[0]


def test_fusable_chunk_function_equals_the_eager_one():
    # The compiled form is written differently (no in-place updates, no scatter): same values.
    logits = torch.randn(9, 17, generator=torch.Generator().manual_seed(9)) * 3
    target = torch.tensor([0, 16, 3, 3, 8, 1, 2, 15, 9])
    fused = loss_lib._fusable_chunk_loss_and_grad(logits, target, 0.1, torch.float32)
    eager = loss_lib._chunk_loss_and_grad(logits, target, 0.1, torch.float32)
    for ours, reference in zip(fused, eager, strict=True):
        torch.testing.assert_close(ours, reference)
