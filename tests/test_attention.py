"""Section 3.2: the fused and explicit attention paths against torch's references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.kernels import PAPER, SpeedPaths, install_speed_paths
from pipeline.kernels.cpu_attention import cpu_scaled_dot_product_attention
from pipeline.model.attention import (
    KeyValueCache,
    MultiHeadAttention,
    causal_attention_mask,
    padding_attention_mask,
    scaled_dot_product_attention,
)
from pipeline.rounding import BF16_EPS, FP32_EPS, float32_tolerance

B, H, T_Q, T_K, D_K = 3, 4, 5, 7, 8


@pytest.fixture
def qkv():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T_Q, D_K, generator=gen)
    k = torch.randn(B, H, T_K, D_K, generator=gen)
    v = torch.randn(B, H, T_K, D_K, generator=gen)
    return q, k, v


def attention_tolerance(q, k, v) -> float:
    """How far two float32 evaluations of softmax(q k^T / sqrt(d_k)) v may lie apart: a score
    sums d_k products (of total size |q| |k|^T / sqrt(d_k)), the softmax's normaliser and the
    weighted sum one term per key. An error in a score changes its weight by as much relative
    to it, hence the output by as much times the largest |v|."""
    d_k, keys = q.size(-1), k.size(-2)
    score_size = float((q.abs() @ k.abs().transpose(-2, -1)).max()) / d_k**0.5
    return float32_tolerance(d_k + 2 * keys, max(score_size, 1.0) * float(v.abs().max()))


def mha_tolerance(mha: MultiHeadAttention, keys: int, *compared: torch.Tensor) -> float:
    """Two float32 evaluations of multi-head attention apart: the input and output projections
    (d_model and h d_k products) around the attention of one head (d_k + 2 * keys sums, see
    `attention_tolerance`), the terms of the size of the values compared (inputs of order one)."""
    terms = mha.d_model + mha.inner + mha.d_k + 2 * keys
    return float32_tolerance(terms, max(1.0, *(float(t.detach().abs().max()) for t in compared)))


def key_padding(lengths: list[int], key_len: int) -> torch.Tensor:
    """(B, T_k) bool, True = pad, from the number of real keys per row."""
    return torch.arange(key_len)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("fused", [True, False])
def test_padding_mask_matches_torch_reference(qkv, fused):
    q, k, v = qkv
    mask = padding_attention_mask(key_padding([7, 4, 1], T_K))
    ours, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask, fused=fused)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(B, H, T_Q, T_K))
    torch.testing.assert_close(ours, reference, atol=attention_tolerance(q, k, v), rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_causal_mask_matches_torch_reference(qkv, fused):
    q, k, v = qkv
    k, v = k[:, :, :T_Q], v[:, :, :T_Q]  # square self-attention
    ours, _ = scaled_dot_product_attention(q, k, v, causal=True, fused=fused)
    tril = torch.ones(T_Q, T_Q, dtype=torch.bool).tril()
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=tril)
    torch.testing.assert_close(ours, reference, atol=attention_tolerance(q, k, v), rtol=0)
    # Query 0 sees only key 0: its weight is exp(s) over the same exp(s), 1 up to the rounding
    # of a division, so its output is v_0 up to that and the rounding of one product: 2 eps.
    torch.testing.assert_close(ours[:, :, 0], v[:, :, 0], atol=0, rtol=2 * FP32_EPS)


def test_fused_equals_explicit_with_padding_and_causal(qkv):
    q, k, v = qkv
    mask = padding_attention_mask(key_padding([7, 6, 5], T_K))
    # 5 queries appended after 2 cached keys: query i sits at position 2 + i.
    fused, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask, causal=True, fused=True)
    explicit, weights = scaled_dot_product_attention(
        q, k, v, attn_mask=mask, causal=True, fused=False, need_weights=True
    )
    torch.testing.assert_close(fused, explicit, atol=attention_tolerance(q, k, v), rtol=0)
    allowed = mask & causal_attention_mask(T_Q, T_K, q.device)
    assert torch.all(weights[~allowed.expand_as(weights)] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T_Q))
    # Row 2 of batch 1: position 4 with 6 real keys -> keys 0..4 visible.
    assert (weights[1, :, 2, :5] > 0).all() and (weights[1, :, 2, 5:] == 0).all()


def test_explicit_weights_are_the_softmax_formula(qkv):
    q, k, v = qkv
    _, weights = scaled_dot_product_attention(q, k, v, fused=False, need_weights=True)
    expected = torch.softmax(q @ k.transpose(-2, -1) / D_K**0.5, dim=-1)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_rows_give_zeros_not_nan(qkv, fused):
    q, k, v = qkv
    mask = padding_attention_mask(key_padding([0, 3, 7], T_K))
    out, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask, fused=fused)
    assert torch.isfinite(out).all()
    assert torch.all(out[0] == 0)


def copy_into_torch_mha(ours: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    theirs = torch.nn.MultiheadAttention(ours.d_model, ours.heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return theirs.eval()


def randomize_biases(module: torch.nn.Module) -> None:
    """Zero-initialised biases would hide a bias mix-up: make them random."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_()


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("fused", [True, False])
def test_self_attention_matches_torch_multihead_attention(heads, fused):
    torch.manual_seed(1)
    d_model, length = 16, 6
    ours = MultiHeadAttention(d_model, heads, fused=fused).eval()
    randomize_biases(ours)
    theirs = copy_into_torch_mha(ours)
    x = torch.randn(2, length, d_model)
    pad = key_padding([6, 3], length)
    out, _ = ours(x, attn_mask=padding_attention_mask(pad))
    expected, _ = theirs(x, x, x, key_padding_mask=pad, need_weights=False)
    tolerance = mha_tolerance(ours, length, x, expected)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)

    out, _ = ours(x, causal=True)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(length)
    expected, _ = theirs(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(out, expected, atol=mha_tolerance(ours, length, x, expected), rtol=0)


def test_cross_attention_matches_torch_and_returns_weights():
    torch.manual_seed(2)
    d_model, heads = 16, 4
    ours = MultiHeadAttention(d_model, heads).eval()
    randomize_biases(ours)
    theirs = copy_into_torch_mha(ours)
    x, memory = torch.randn(2, 3, d_model), torch.randn(2, 5, d_model)
    pad = key_padding([5, 2], 5)
    out, weights = ours(x, memory, attn_mask=padding_attention_mask(pad), need_weights=True)
    expected, expected_weights = theirs(
        x, memory, memory, key_padding_mask=pad, average_attn_weights=False
    )
    tolerance = mha_tolerance(ours, memory.size(1), x, memory, expected)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=tolerance, rtol=0)  # weights <= 1


def decode_step_by_step(mha: MultiHeadAttention, x: torch.Tensor):
    """Causal self-attention over x one position at a time with a cache equals the full pass:
    (the full pass, the tolerance it was held to, the cache)."""
    full, _ = mha(x, causal=True)
    cache = KeyValueCache()
    steps = [mha(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(x.size(1))]
    # Not exact: one query and a block of queries may take different matrix kernels.
    tolerance = mha_tolerance(mha, x.size(1), x, full)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=tolerance, rtol=0)
    return full, tolerance, cache


def test_incremental_self_attention_equals_full_causal():
    torch.manual_seed(3)
    d_model, heads, length = 16, 2, 5
    mha = MultiHeadAttention(d_model, heads).eval()
    x = torch.randn(2, length, d_model)
    full, tolerance, cache = decode_step_by_step(mha, x)
    assert cache.keys.shape == (2, heads, length, d_model // heads)
    # A block of several new positions after a cached prefix uses the offset causal mask.
    cache = KeyValueCache()
    first, _ = mha(x[:, :2], causal=True, cache=cache)
    rest, _ = mha(x[:, 2:], causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=tolerance, rtol=0)


def test_cross_attention_cache_projects_memory_once():
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2).eval()
    x, memory = torch.randn(1, 1, 8), torch.randn(1, 4, 8)
    cache = KeyValueCache()
    first, _ = mha(x, memory, cache=cache)
    keys = cache.keys
    # Later steps reuse the cached projection, even if handed a different memory.
    second, _ = mha(x, torch.zeros_like(memory), cache=cache)
    assert cache.keys is keys
    torch.testing.assert_close(first, second)


def test_attention_dropout_only_in_training():
    torch.manual_seed(5)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 4, 8)
    mha.train()
    assert not torch.allclose(mha(x)[0], mha(x)[0])
    mha.eval()
    torch.testing.assert_close(mha(x)[0], mha(x)[0])


@pytest.mark.parametrize("d_model,heads", [(10, 3), (8, 0), (8, -2)])
def test_heads_must_divide_d_model(d_model, heads):
    with pytest.raises(ValueError, match="d_model"):
        MultiHeadAttention(d_model, heads)


def test_config_rejects_heads_not_dividing_d_model(make_config):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="model.heads"):
        make_config("model.d_model=10", "model.heads=3")


@pytest.mark.parametrize("query_len", [1, T_Q])  # a cached decoding step; a training block
def test_bf16_attention_matches_the_fp32_reference_on_either_path(qkv, speed_paths, query_len):
    """Under CPU bf16 autocast the CPU path runs the explicit formula (torch's fused backward
    is slow there), the generic path torch's kernel: both agree with fp32 attention, forward
    and backward, to bf16's precision."""
    q, k, v = (t.clone().requires_grad_() for t in qkv)
    q_block = q[:, :, :query_len]
    mask = padding_attention_mask(key_padding([7, 4, 1], T_K))
    reference = F.scaled_dot_product_attention(q_block, k, v, attn_mask=mask)
    (grad_q_ref,) = torch.autograd.grad(reference.square().sum(), q)
    attention = install_speed_paths(MultiHeadAttention(8, 2), speed_paths).attention
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = attention(q_block, k, v, attn_mask=mask, fused=True)
    (grad_q,) = torch.autograd.grad(ours.float().square().sum(), q)
    # bf16's arithmetic, not a machine: every CPU rounds the same float32 inputs to bf16 alike
    # (round to nearest even) and sums in float32, whose order (up to D_K + T_K terms: 15 x
    # float32 eps, 2e-6) is all that differs between CPUs. The forward rounds q, k and v, the
    # scores, the weights and the output (eps / 2 each), and softmax and weighted sum can
    # double an error: 4 eps. The backward passes each rounding a second time: 8 eps.
    torch.testing.assert_close(ours.float(), reference, atol=4 * BF16_EPS, rtol=4 * BF16_EPS)
    torch.testing.assert_close(grad_q, grad_q_ref, atol=8 * BF16_EPS, rtol=8 * BF16_EPS)


@pytest.mark.parametrize("query_len", [1, T_Q])
def test_cpu_attention_option_picks_the_path(qkv, query_len):
    """`SpeedPaths.cpu_attention` runs the explicit formula under CPU bf16 autocast (for a
    block and a single query), the default runs torch's kernel: each output is exactly what
    that path computes. `install_speed_paths` sets the path on MultiHeadAttention."""
    q, k, v = (t.bfloat16() for t in qkv)  # as the projections under autocast give them
    q_block = q[:, :, :query_len]
    mask = padding_attention_mask(key_padding([7, 4, 1], T_K))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explicit, _ = scaled_dot_product_attention(q_block, k, v, attn_mask=mask, fused=False)
        kernel = F.scaled_dot_product_attention(q_block, k, v, attn_mask=mask)
        on, _ = cpu_scaled_dot_product_attention(q_block, k, v, attn_mask=mask)
        off, _ = scaled_dot_product_attention(q_block, k, v, attn_mask=mask)
    assert not torch.equal(explicit, kernel)  # the two paths are told apart
    assert torch.equal(on, explicit) and torch.equal(off, kernel)
    mha = install_speed_paths(MultiHeadAttention(8, 2), SpeedPaths(cpu_attention=True))
    assert mha.attention is cpu_scaled_dot_product_attention
    assert install_speed_paths(mha, PAPER).attention is scaled_dot_product_attention


def reference_multi_head(mha: MultiHeadAttention, query, memory=None, may_attend=None):
    """3.2.2 written out head by head with d_k free: head_i = softmax(Q W_i^Q (K W_i^K)^T /
    sqrt(d_k)) V W_i^V over the rows W_i of the stacked projection, Concat(head_i) W^O.
    `may_attend` (B, T_q, T_k) bool."""
    d_k, inner = mha.d_k, mha.inner
    weight, bias = mha.in_proj.weight, mha.in_proj.bias
    keys_from = query if memory is None else memory
    heads = []
    for i in range(mha.heads):
        rows = slice(i * d_k, (i + 1) * d_k)
        q = query @ weight[rows].T + bias[rows]
        k = keys_from @ weight[inner:][rows].T + bias[inner:][rows]
        v = keys_from @ weight[2 * inner :][rows].T + bias[2 * inner :][rows]
        scores = q @ k.transpose(-2, -1) / d_k**0.5
        if may_attend is not None:
            scores = scores.masked_fill(~may_attend, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return mha.out_proj(torch.cat(heads, dim=-1))


def randomized_mha(
    d_model: int, heads: int, head_dim: int, speed_paths: SpeedPaths = PAPER, **options
) -> MultiHeadAttention:
    mha = MultiHeadAttention(d_model, heads, head_dim=head_dim, **options).eval()
    install_speed_paths(mha, speed_paths)
    randomize_biases(mha)
    return mha


@pytest.mark.parametrize("d_model,heads,head_dim", [(16, 4, 8), (16, 2, 3), (10, 3, 4)])
def test_head_dim_sets_the_projection_widths(d_model, heads, head_dim):
    """W^Q, W^K, W^V map d_model to h d_k and W^O maps it back; heads need not divide d_model."""
    mha = MultiHeadAttention(d_model, heads, head_dim=head_dim)
    assert (mha.d_k, mha.inner) == (head_dim, heads * head_dim)
    assert mha.in_proj.weight.shape == (3 * heads * head_dim, d_model)
    assert mha.out_proj.weight.shape == (d_model, heads * head_dim)
    params = sum(p.numel() for p in mha.parameters())
    assert params == 3 * heads * head_dim * (d_model + 1) + (heads * head_dim + 1) * d_model


@pytest.mark.parametrize("head_dim", [0, -4])
def test_head_dim_must_be_positive(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(16, 4, head_dim=head_dim)


def test_head_dim_of_d_model_over_heads_is_the_default_model():
    """The same seed gives the same parameters and the same outputs, bit for bit."""
    torch.manual_seed(7)
    default = MultiHeadAttention(16, 4)
    torch.manual_seed(7)
    explicit = MultiHeadAttention(16, 4, head_dim=4)
    for (name, a), (_, b) in zip(default.state_dict().items(), explicit.state_dict().items()):
        assert torch.equal(a, b), name
    x = torch.randn(2, 5, 16)
    assert torch.equal(default(x, causal=True)[0], explicit(x, causal=True)[0])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("heads,head_dim", [(4, 8), (2, 3)])  # h d_k above and below d_model
def test_head_dim_apart_from_width_matches_the_reference(fused, heads, head_dim, speed_paths):
    """Self-attention (padding and causal masks) and cross-attention with d_k != d_model / h
    against the head-by-head formula, on either speed path."""
    torch.manual_seed(11)
    d_model = 16
    mha = randomized_mha(d_model, heads, head_dim, fused=fused, speed_paths=speed_paths)
    x, memory = torch.randn(3, T_Q, d_model), torch.randn(3, T_K, d_model)
    pad = key_padding([5, 3, 1], T_Q)
    ours, _ = mha(x, attn_mask=padding_attention_mask(pad))
    expected = reference_multi_head(mha, x, may_attend=~pad[:, None, :].expand(3, T_Q, T_Q))
    real = ~pad  # fully masked rows: zeros here, NaN in the reference
    tolerance = mha_tolerance(mha, T_Q, x, expected[real])
    torch.testing.assert_close(ours[real], expected[real], atol=tolerance, rtol=0)

    ours, _ = mha(x, causal=True)
    expected = reference_multi_head(mha, x, may_attend=causal_attention_mask(T_Q, T_Q, x.device))
    torch.testing.assert_close(ours, expected, atol=mha_tolerance(mha, T_Q, x, expected), rtol=0)

    memory_pad = key_padding([7, 4, 2], T_K)
    ours, weights = mha(x, memory, attn_mask=padding_attention_mask(memory_pad), need_weights=True)
    may_attend = ~memory_pad[:, None, :].expand(3, T_Q, T_K)
    expected = reference_multi_head(mha, x, memory, may_attend)
    tolerance = mha_tolerance(mha, T_K, x, memory, expected)
    torch.testing.assert_close(ours, expected, atol=tolerance, rtol=0)
    assert weights.shape == (3, heads, T_Q, T_K)


def test_head_dim_apart_from_width_caches_as_the_full_pass(speed_paths):
    """Incremental self-attention and beam rows sharing one memory row, with d_k != d_model / h."""
    torch.manual_seed(12)
    d_model, heads, head_dim, length = 16, 2, 12, 5
    mha = randomized_mha(d_model, heads, head_dim, speed_paths=speed_paths)
    x = torch.randn(2, length, d_model)
    _, _, cache = decode_step_by_step(mha, x)
    assert cache.keys.shape == (2, heads, length, head_dim)

    memory = torch.randn(1, T_K, d_model)
    shared, _ = mha(x, memory, cache=KeyValueCache())  # two beams of one sentence
    copies, _ = mha(x, memory.expand(2, -1, -1))
    tolerance = mha_tolerance(mha, T_K, x, memory, copies)
    torch.testing.assert_close(shared, copies, atol=tolerance, rtol=0)
