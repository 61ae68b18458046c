"""Sections 3.1 and 3.3: layers against torch.nn.TransformerEncoderLayer / DecoderLayer with copied
weights, and the FFN against its formula."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.config_schema import ModelConfig
from pipeline.model.attention import MultiHeadAttention, padding_attention_mask
from pipeline.model.layers import (
    DecoderLayer,
    DecoderLayerCache,
    EncoderLayer,
    PositionwiseFeedForward,
    ResidualNorm,
)
from pipeline.rounding import float32_tolerance


def small_config(**overrides) -> ModelConfig:
    values = dict(d_model=16, heads=4, d_ff=32, dropout=0.0, encoder_layers=2, decoder_layers=2)
    return ModelConfig(**{**values, **overrides})


def randomize(module: nn.Module) -> None:
    """Non-trivial biases and LayerNorm affines, so that a mix-up in copying shows."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.dim() == 1:
                param.normal_(mean=1.0 if name.endswith("norm.weight") else 0.0, std=0.5)


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(ours.in_proj.weight)
    theirs.in_proj_bias.copy_(ours.in_proj.bias)
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_ffn(ours: PositionwiseFeedForward, theirs: nn.Module) -> None:
    theirs.linear1.load_state_dict(ours.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.linear2.state_dict())


@torch.no_grad()
def copy_encoder_layer(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer) -> None:
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_ffn(ours.ffn, theirs)
    theirs.norm1.load_state_dict(ours.self_attn_residual.norm.state_dict())
    theirs.norm2.load_state_dict(ours.ffn_residual.norm.state_dict())


@torch.no_grad()
def copy_decoder_layer(ours: DecoderLayer, theirs: nn.TransformerDecoderLayer) -> None:
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_attention(ours.cross_attn, theirs.multihead_attn)
    _copy_ffn(ours.ffn, theirs)
    theirs.norm1.load_state_dict(ours.self_attn_residual.norm.state_dict())
    theirs.norm2.load_state_dict(ours.cross_attn_residual.norm.state_dict())
    theirs.norm3.load_state_dict(ours.ffn_residual.norm.state_dict())


def layer_tolerance(cfg: ModelConfig, keys: int, *compared: torch.Tensor, decoder=False) -> float:
    """Two float32 evaluations of one layer apart: per attention its projections (3 d_model
    products into q, k, v, d_model out), scores (d_k) and softmax and weighted sum (a term per
    key each); the feed-forward's two sums (d_model, d_ff); each LayerNorm's mean and variance
    (d_model each). The terms are of the size of the values compared (inputs of order one)."""
    attention = 4 * cfg.d_model + cfg.d_model // cfg.heads + 2 * keys
    attentions, norms = (2, 3) if decoder else (1, 2)
    terms = attentions * attention + cfg.d_model + cfg.d_ff + norms * 2 * cfg.d_model
    return float32_tolerance(terms, max(1.0, *(float(t.detach().abs().max()) for t in compared)))


def torch_layer_kwargs(cfg: ModelConfig) -> dict:
    return dict(
        d_model=cfg.d_model,
        nhead=cfg.heads,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=cfg.norm_first,
    )


def lengths_to_padding(lengths: list[int], max_len: int) -> torch.Tensor:
    return torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]


def test_ffn_is_the_formula():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 20)
    x = torch.randn(2, 3, 8)
    w1, b1, w2, b2 = ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias
    expected = torch.clamp(x @ w1.T + b1, min=0) @ w2.T + b2  # max(0, x W1 + b1) W2 + b2
    tolerance = float32_tolerance(8 + 64, max(1.0, float(expected.detach().abs().max())))
    torch.testing.assert_close(ffn(x), expected, atol=tolerance, rtol=0)  # two sums: d_model, d_ff


def test_activation_dropout_acts_after_relu_in_training_only():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 64, activation_dropout=0.5)
    x = torch.randn(4, 8)
    hidden = []
    ffn.linear2.register_forward_pre_hook(lambda module, args: hidden.append(args[0]))
    ffn.train()(x)
    ffn.eval()(x)
    train_hidden, eval_hidden = hidden
    assert (eval_hidden >= 0).all()
    zeroed = (train_hidden == 0) & (eval_hidden > 0)
    # p = 0.5 over the ~128 positive entries: a binomial fraction, 0.5 +- 0.2 is 4.5 standard
    # deviations (seeded, so the same draw on every machine).
    assert 0.3 < zeroed.float().sum() / (eval_hidden > 0).sum() < 0.7
    kept = train_hidden != 0
    # 1 / (1 - p) = 2, a power of two: exact; the two calls' first layers (8 products each)
    # are not assumed to be summed alike.
    expected = 2 * eval_hidden[kept]
    tolerance = float32_tolerance(8, max(1.0, float(expected.detach().abs().max())))
    torch.testing.assert_close(train_hidden[kept], expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_norm_order(norm_first):
    torch.manual_seed(0)
    block = ResidualNorm(6, dropout=0.0, norm_first=norm_first)
    randomize(block)
    x, y = torch.randn(2, 6), torch.randn(2, 6)
    norm = block.norm
    # The same operations on the same tensors, in the same kernels: equal bit for bit.
    if norm_first:
        assert torch.equal(block.sublayer_input(x), norm(x))
        assert torch.equal(block(x, y), x + y)
    else:
        assert torch.equal(block.sublayer_input(x), x)
        assert torch.equal(block(x, y), norm(x + y))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first):
    torch.manual_seed(1)
    cfg = small_config(norm_first=norm_first)
    ours = EncoderLayer(cfg).eval()
    randomize(ours)
    theirs = nn.TransformerEncoderLayer(**torch_layer_kwargs(cfg)).train()  # train: no fast path
    copy_encoder_layer(ours, theirs)
    x, pad = torch.randn(3, 7, cfg.d_model), lengths_to_padding([7, 5, 2], 7)
    out = ours(x, padding_attention_mask(pad))
    expected = theirs(x, src_key_padding_mask=pad)
    torch.testing.assert_close(out, expected, atol=layer_tolerance(cfg, 7, x, expected), rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first):
    torch.manual_seed(2)
    cfg = small_config(norm_first=norm_first)
    ours = DecoderLayer(cfg).eval()
    randomize(ours)
    theirs = nn.TransformerDecoderLayer(**torch_layer_kwargs(cfg)).train()
    copy_decoder_layer(ours, theirs)
    x, memory = torch.randn(3, 5, cfg.d_model), torch.randn(3, 7, cfg.d_model)
    memory_pad = lengths_to_padding([7, 4, 1], 7)
    out, weights = ours(x, memory, padding_attention_mask(memory_pad), need_weights=True)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = theirs(x, memory, tgt_mask=causal, memory_key_padding_mask=memory_pad)
    tolerance = layer_tolerance(cfg, 7, x, memory, expected, decoder=True)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)
    assert weights.shape == (3, cfg.heads, 5, 7)
    assert torch.all(weights[2, :, :, 1:] == 0)  # only one real source token in sentence 2


def test_decoder_layer_incremental_equals_full():
    torch.manual_seed(3)
    cfg = small_config()
    layer = DecoderLayer(cfg).eval()
    x, memory = torch.randn(2, 6, cfg.d_model), torch.randn(2, 4, cfg.d_model)
    mask = padding_attention_mask(lengths_to_padding([4, 3], 4))
    full, _ = layer(x, memory, mask)
    cache = DecoderLayerCache()
    steps = [layer(x[:, t : t + 1], memory, mask, cache=cache)[0] for t in range(6)]
    # Not exact: one query and a block of queries may take different matrix kernels.
    tolerance = layer_tolerance(cfg, 6, x, memory, full, decoder=True)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=tolerance, rtol=0)


def test_sublayer_dropout_active_in_training():
    torch.manual_seed(4)
    cfg = small_config(dropout=0.5)
    layer = EncoderLayer(cfg)
    x, mask = torch.randn(2, 5, 16), padding_attention_mask(lengths_to_padding([5, 5], 5))
    layer.train()
    assert not torch.allclose(layer(x, mask), layer(x, mask))
    layer.eval()
    # Not assumed bit for bit: a matrix library may block a product by its buffers' alignment.
    out = layer(x, mask)
    torch.testing.assert_close(layer(x, mask), out, atol=layer_tolerance(cfg, 5, x, out), rtol=0)
