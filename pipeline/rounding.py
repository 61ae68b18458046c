"""How far two float32 evaluations of the same computation may lie apart.

Comparing two implementations of one model (ours and a peer's, a cached and a recomputed
decode, a model and its export) needs a tolerance that holds on any CPU: a worst-case bound
on rounding, not a number found by trial on one machine. For recursive summation of n terms
each evaluation is within γ_n Σ|x_i| of the exact sum, γ_n = n·u / (1 - n·u) ≈ n·u with
u = eps / 2 (Higham, Accuracy and Stability of Numerical Algorithms, §4.2), so two evaluations
are within about n·eps Σ|x_i| of each other, whatever summation order, vector width or fused
multiply-add each uses. torch is not imported here: test set-up reads these before it sets
the thread counts torch starts with.
"""

from __future__ import annotations

# Units of least precision at 1 (torch.finfo(...).eps), written out (see the module's note).
FP32_EPS = 2.0**-23
BF16_EPS = 2.0**-7


def float32_tolerance(terms: int, scale: float = 1.0) -> float:
    """How far two float32 evaluations of the same sum of `terms` products may lie apart:
    `terms` * FP32_EPS * `scale`, where `scale` is the size of the summed terms (Σ|x_i|; the
    size of the values compared where the terms are of their order). For a chain of sums (a
    layer, a model) pass the chain's total length, e.g. `reduction_length`."""
    return terms * FP32_EPS * scale


def reduction_length(model, keys: int | None = None) -> int:
    """The most float32 products summed on the way from the inputs to one log-prob: each
    attention's projection (d_model), scores (d_k: model.head_dim, else d_model / heads),
    weighted sum (up to max_positions keys) and output projection (heads * d_k); each
    feed-forward's two layers (d_model, d_ff); each LayerNorm's mean and variance (d_model);
    the output layer (d_model) and the log-softmax's normaliser (vocab). `keys`: the longest sequence attended to, where
    the inputs are known to be shorter than max_positions."""
    cfg = model.cfg
    keys = cfg.max_positions if keys is None else keys
    d_k = cfg.d_model // cfg.heads if cfg.head_dim is None else cfg.head_dim
    attention = 2 * cfg.d_model + cfg.heads * d_k + d_k + keys
    norm, ffn = cfg.d_model, cfg.d_model + cfg.d_ff
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return (cfg.encoder_layers * encoder_layer + cfg.decoder_layers * decoder_layer
            + cfg.d_model + model.vocab_size)  # fmt: skip


def log_prob_tolerance(model, log_probs, keys: int | None = None) -> float:
    """How far two float32 implementations of the same model may put log P(hypothesis), for
    the (positions, vocab) log-probs of its tokens: the reduction length times the spread of
    each position's logits (a log-softmax does not see what all logits share), summed over the
    positions."""
    spread = (log_probs.amax(dim=1) - log_probs.amin(dim=1)).sum()
    return float32_tolerance(reduction_length(model, keys), float(spread))


def logit_tolerances(model, logits, keys: int | None = None):
    """How far two float32 implementations of the same model may put each logit, for
    (..., vocab) logits: the reduction length times the largest logit at that position (a raw
    logit keeps what all logits share), one bound per position (the shape less its last axis)."""
    return float32_tolerance(reduction_length(model, keys), logits.abs().amax(dim=-1))
