"""Section 5.4: the label-smoothed cross-entropy, and the same loss fused with the output layer.

    loss = sum_t [(1 - eps) * -log p(y_t) + eps * (1/V) sum_v -log p(v)]     (summed over non-pad t)

q = (1 - eps) * onehot(y) + eps / V spreads the smoothing mass uniformly over the whole
vocabulary, as `F.cross_entropy(label_smoothing=eps)` does. No one-hot targets are built:
from one fused log_softmax pass, -log p(y) is a gather and (1/V) sum_v -log p(v) a row mean,
and the gradient is  d loss / d z_v = softmax(z)_v - eps / V - (1 - eps) * [v == y].

`output_layer_loss` is what training uses: for a small model with a large vocabulary (Multi30k
tiny: d_model 128, V 10k) the (N, V) logits, their float32 copy and their gradient are most of a
step's memory traffic. It computes logits, loss and gradients chunk by chunk of rows, so no
(N, V) tensor is ever built and each chunk stays in cache (`benchmarks/train_throughput.py`).
With `compiled=True` each chunk's softmax, loss and gradient run as one `torch.compile`d
function, which fuses the elementwise passes over the (chunk, V) logits into a few loops.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


class _LabelSmoothedNll(torch.autograd.Function):
    """`label_smoothed_nll` on (N, V) logits with a hand-written backward: one softmax pass
    and in-place updates instead of autograd's chain through logsumexp/gather/mean, each of
    which materialises an (N, V) tensor."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):
        is_token = target.ne(pad_id)
        loss, nll = _smoothed_and_nll(torch.log_softmax(logits, dim=-1), target, epsilon)
        ctx.save_for_backward(logits, target, is_token)
        ctx.epsilon = epsilon
        return loss.masked_fill(~is_token, 0.0).sum(), nll.masked_fill(~is_token, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        logits, target, is_token = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        # d nll / d z = softmax - onehot: the nll output's gradient joins with weight grad_nll.
        weight = is_token.to(logits.dtype).unsqueeze(-1)  # (N, 1); pads get no gradient
        total = weight * (grad_loss + grad_nll)
        grad = torch.softmax(logits, dim=-1).mul_(total).sub_(weight * (grad_loss * eps / vocab))
        onehot = weight * (grad_loss * (1.0 - eps) + grad_nll)
        grad.scatter_add_(-1, target.unsqueeze(-1), -onehot)
        return grad, None, None, None


def _smoothed_and_nll(log_probs: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """log p (N, V) float32, target (N,) -> per-row (smoothed loss, nll), both (N,)."""
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    uniform_ce = -log_probs.mean(dim=-1)  # (1/V) sum_v -log p(v)
    return (1.0 - epsilon) * nll + epsilon * uniform_ce, nll


def label_smoothed_nll(
    logits: Tensor, target: Tensor, *, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """logits (B, T, V), target (B, T) -> (smoothed loss, nll), each summed over non-pad
    tokens, computed in float32 (also for bf16 logits under autocast)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    flat = logits.reshape(-1, logits.size(-1))
    return _LabelSmoothedNll.apply(flat, target.reshape(-1), float(epsilon), int(pad_id))


log = logging.getLogger(__name__)

# (logits (c, V) in the compute dtype, target (c,), epsilon, gradient dtype) ->
# (smoothed loss summed, nll summed, d loss / d logits (c, V) in the gradient dtype)
ChunkFn = Callable[[Tensor, Tensor, float, torch.dtype], tuple[Tensor, Tensor, Tensor]]


def _chunk_log_probs_and_loss(logits: Tensor, target: Tensor, epsilon: float):
    """logits (c, V) -> (float32 log p (c, V), smoothed loss summed, nll summed)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (c, V)
    loss, nll = _smoothed_and_nll(log_probs, target, epsilon)
    return log_probs, loss.sum(), nll.sum()


def _chunk_loss_and_grad(logits: Tensor, target: Tensor, epsilon: float, grad_dtype: torch.dtype):
    """Eagerly: one log_softmax, its `exp_` in place as the softmax (the fewest (c, V) tensors)."""
    vocab = logits.size(-1)
    log_probs, loss, nll = _chunk_log_probs_and_loss(logits, target, epsilon)
    # d loss / d logits = softmax - eps/V - (1 - eps) onehot(y), in place
    grad = log_probs.exp_().sub_(epsilon / vocab)
    grad.scatter_add_(-1, target.unsqueeze(-1), grad.new_full((grad.size(0), 1), epsilon - 1.0))
    return loss, nll, grad.to(grad_dtype)


def _fusable_chunk_loss_and_grad(
    logits: Tensor, target: Tensor, epsilon: float, grad_dtype: torch.dtype
):
    """The same values written without in-place updates or scatter, so that inductor fuses
    them (compiled: 3700 x 10000 bf16 output layer + loss + gradient, 200 -> 142 ms on 2 CPU
    cores). Eagerly this form is ~3x slower than `_chunk_loss_and_grad`, hence two."""
    z = logits.float()  # (c, V)
    vocab = z.size(-1)
    log_z = torch.logsumexp(z, dim=-1, keepdim=True)  # (c, 1)
    log_p_target = z.gather(-1, target.unsqueeze(-1)) - log_z  # (c, 1)
    mean_log_p = z.mean(dim=-1, keepdim=True) - log_z  # (1/V) sum_v log p(v)
    loss = -((1.0 - epsilon) * log_p_target + epsilon * mean_log_p).sum()
    is_target = torch.arange(vocab, device=z.device) == target.unsqueeze(-1)  # (c, V)
    grad = (z - log_z).exp() - epsilon / vocab - (1.0 - epsilon) * is_target
    return loss, -log_p_target.sum(), grad.to(grad_dtype)


class _CompiledChunk:
    """`_fusable_chunk_loss_and_grad` compiled (dynamic rows: the last chunk of each batch is
    shorter); if compiling fails (no C++ compiler, an unsupported backend), a warning and the
    eager chunk function from then on."""

    def __init__(self) -> None:
        self.compiled = torch.compile(_fusable_chunk_loss_and_grad, dynamic=True)
        self.failed = False

    def __call__(self, logits, target, epsilon, grad_dtype):
        if not self.failed:
            try:
                return self.compiled(logits, target, epsilon, grad_dtype)
            except Exception as err:  # torch._dynamo / inductor errors have no common base
                self.failed = True
                log.warning("runtime.compile_loss: torch.compile failed (%s); the loss runs "
                            "eagerly (slower)", err)  # fmt: skip
        return _chunk_loss_and_grad(logits, target, epsilon, grad_dtype)


@functools.cache
def compiled_chunk_fn() -> ChunkFn:
    """One compiled chunk function per process (compiled kernels are also cached on disk)."""
    return _CompiledChunk()


class _OutputLayerLoss(torch.autograd.Function):
    """Logits = hidden @ weight^T (+ bias) and their label-smoothed loss, by chunks of rows.

    The gradients are computed in the forward pass, chunk by chunk, while each chunk's logits
    are in cache, and scaled by the incoming gradient in the backward pass. The nll output
    is a metric (not differentiable)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, epsilon, chunk_rows, compute_dtype, chunk_fn):
        # hidden (N, d) rows that carry a loss (no padding), weight (V, d), bias (V,) or None.
        wants_grad = any(ctx.needs_input_grad[:3])
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        nll = torch.zeros_like(loss)
        if wants_grad:
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            grad_bias = None if bias is None else torch.zeros_like(grad_weight[:, 0])
        for start in range(0, hidden.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = F.linear(h[rows], w, b)  # (c, V)
            if not wants_grad:
                _, chunk_loss, chunk_nll = _chunk_log_probs_and_loss(logits, target[rows], epsilon)
                loss += chunk_loss
                nll += chunk_nll
                continue
            chunk_loss, chunk_nll, grad = chunk_fn(logits, target[rows], epsilon, compute_dtype)
            loss += chunk_loss
            nll += chunk_nll
            grad_hidden[rows] = grad @ w
            grad_weight += (grad.t() @ h[rows]).float()
            if grad_bias is not None:
                grad_bias += grad.float().sum(0)
        if wants_grad:
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
            ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            (grad_weight * grad_loss).to(weight_dtype),
            None if grad_bias is None else (grad_bias * grad_loss).to(bias_dtype),
            None, None, None, None, None,
        )  # fmt: skip


def output_layer_loss(
    hidden: Tensor,
    output_layer: torch.nn.Linear,
    target: Tensor,
    *,
    epsilon: float,
    pad_id: int,
    chunk_rows: int,
    compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """`label_smoothed_nll(output_layer(hidden), target)` without building the logits:
    hidden (B, T, d_model), target (B, T) -> (smoothed loss, nll) summed over non-pad tokens.
    Padding rows are dropped before the output layer; the matmuls run in the autocast dtype
    when autocast is on (as `nn.Linear` would), the softmax in float32; `compiled`: each chunk's
    softmax, loss and gradient as one `torch.compile`d function (`runtime.compile_loss`)."""
    is_token = target.ne(pad_id)
    rows = hidden[is_token]  # (N, d_model), N = non-pad target tokens
    device_type = hidden.device.type
    compute_dtype = (
        torch.get_autocast_dtype(device_type)
        if torch.is_autocast_enabled(device_type)
        else hidden.dtype
    )
    with torch.autocast(device_type, enabled=False):
        return _OutputLayerLoss.apply(
            rows, output_layer.weight, output_layer.bias, target[is_token],
            float(epsilon), int(chunk_rows), compute_dtype,
            compiled_chunk_fn() if compiled else _chunk_loss_and_grad,
        )  # fmt: skip
