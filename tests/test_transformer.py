"""Sections 3 and 3.4: the whole model against torch.nn.Transformer with copied weights (the
oracle), embeddings/tying/initialisation, incremental decoding and cross-attention weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipeline.errors import ConfigError
from pipeline.kernels import PAPER, SpeedPaths, install_speed_paths
from pipeline.model.transformer import DecoderCache, Transformer
from pipeline.rounding import float32_tolerance, reduction_length
from tests.conftest import sample_std_tolerance
from tests.test_layers import (
    copy_decoder_layer,
    copy_encoder_layer,
    lengths_to_padding,
    randomize,
    small_config,
)

VOCAB, PAD = 50, 0


def random_batch(src_lengths, tgt_lengths, seed=0):
    """Padded src (B, S) and tgt_in (B, T) with tokens in [1, VOCAB), pads after the real tokens."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(1, VOCAB, (len(src_lengths), max(src_lengths)), generator=gen)
    tgt = torch.randint(1, VOCAB, (len(tgt_lengths), max(tgt_lengths)), generator=gen)
    src[lengths_to_padding(src_lengths, src.size(1))] = PAD
    tgt[lengths_to_padding(tgt_lengths, tgt.size(1))] = PAD
    return src, tgt


class TorchOracle(nn.Module):
    """torch.nn.Transformer carrying our weights, fed our embeddings + positions, projected with
    our output matrix: everything between embedding and logits is torch's own implementation."""

    def __init__(self, ours: Transformer) -> None:
        super().__init__()
        cfg = ours.cfg
        self.ours = ours
        self.core = nn.Transformer(
            d_model=cfg.d_model,
            nhead=cfg.heads,
            num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers,
            dim_feedforward=cfg.d_ff,
            dropout=0.0,
            activation="relu",
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        for our_layer, their_layer in zip(ours.encoder_layers, self.core.encoder.layers):
            copy_encoder_layer(our_layer, their_layer)
        for our_layer, their_layer in zip(ours.decoder_layers, self.core.decoder.layers):
            copy_decoder_layer(our_layer, their_layer)
        if cfg.norm_first:
            self.core.encoder.norm.load_state_dict(ours.encoder_norm.state_dict())
            self.core.decoder.norm.load_state_dict(ours.decoder_norm.state_dict())
        else:  # the paper's post-norm stacks end with their last sublayer's LayerNorm
            self.core.encoder.norm = nn.Identity()
            self.core.decoder.norm = nn.Identity()

    def forward(self, src, tgt_in, mask_target_padding: bool):
        ours = self.ours
        src_pad, tgt_pad = src.eq(PAD), tgt_in.eq(PAD)
        length = tgt_in.size(1)
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)  # True = not allowed
        hidden = self.core(
            ours.embed(ours.src_embed, src),
            ours.embed(ours.tgt_embed, tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad if mask_target_padding else None,
            memory_key_padding_mask=src_pad,
        )
        return hidden @ ours.output_projection.weight.T


def model_tolerance(model: Transformer, keys: int, *compared: torch.Tensor) -> float:
    """Two float32 evaluations of the whole model apart: its `reduction_length` (sequences of
    at most `keys` tokens) times the size of the values compared (inputs of order one)."""
    scale = max(1.0, *(float(t.detach().abs().max()) for t in compared))
    return float32_tolerance(reduction_length(model, keys), scale)


def make_model(speed_paths: SpeedPaths = PAPER, **overrides) -> Transformer:
    torch.manual_seed(0)
    model = install_speed_paths(Transformer(small_config(**overrides), VOCAB, PAD), speed_paths)
    model.eval()
    randomize(model)
    return model


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_logits_match_torch_transformer(norm_first, positional, speed_paths):
    model = make_model(speed_paths, norm_first=norm_first, positional=positional, encoder_layers=3)
    oracle = TorchOracle(model).train()  # train mode, dropout 0: torch's general (non-fast) path
    for seed in range(3):
        src, tgt_in = random_batch([9, 4, 1, 7], [6, 6, 2, 3], seed=seed)
        logits = model(src, tgt_in)
        assert logits.shape == (4, 6, VOCAB)
        # Without target padding masks: every position agrees.
        expected = oracle(src, tgt_in, mask_target_padding=False)
        tolerance = model_tolerance(model, src.size(1), expected)
        torch.testing.assert_close(logits, expected, atol=tolerance, rtol=0)
        # With torch's target key-padding mask: every real position agrees (the causal mask
        # already hides the trailing padding from them, which is why we need no such mask).
        expected = oracle(src, tgt_in, mask_target_padding=True)
        real = tgt_in.ne(PAD)
        torch.testing.assert_close(logits[real], expected[real], atol=tolerance, rtol=0)


def test_gradients_match_torch_transformer(speed_paths):
    model = make_model(speed_paths)
    oracle = TorchOracle(model).train()
    src, tgt_in = random_batch([5, 3], [4, 2])
    model(src, tgt_in).square().mean().backward()
    ours = model.src_embed.weight.grad.clone()
    model.zero_grad()
    oracle(src, tgt_in, mask_target_padding=False).square().mean().backward()
    expected = model.src_embed.weight.grad
    # The backward pass runs the forward's sums again, transposed: twice the reduction length.
    tolerance = 2 * model_tolerance(model, src.size(1), ours, expected)
    torch.testing.assert_close(ours, expected, atol=tolerance, rtol=0)


def test_fused_and_explicit_attention_models_agree():
    fused = make_model()
    explicit = Transformer(small_config(fused_attention=False), VOCAB, PAD).eval()
    explicit.load_state_dict(fused.state_dict())
    src, tgt_in = random_batch([6, 2, 4], [5, 1, 3])
    expected = explicit(src, tgt_in)
    tolerance = model_tolerance(fused, src.size(1), expected)
    torch.testing.assert_close(fused(src, tgt_in), expected, atol=tolerance, rtol=0)


def test_embeddings_are_scaled_and_positioned():
    model = make_model(dropout=0.0)
    tokens = torch.tensor([[5, 7, PAD]])
    expected = model.src_embed.weight[tokens] * math.sqrt(16) + model.positional.table[:3]
    torch.testing.assert_close(model.embed(model.src_embed, tokens), expected)


def test_tied_embeddings_share_one_matrix():
    model = Transformer(small_config(), VOCAB, PAD)
    matrix = model.src_embed.weight
    assert model.tgt_embed.weight is matrix and model.output_projection.weight is matrix
    untied = Transformer(small_config(tie_embeddings=False), VOCAB, PAD)
    assert model.num_parameters() == untied.num_parameters() - 2 * VOCAB * 16
    assert untied.tgt_embed.weight is not untied.src_embed.weight
    state = model.state_dict()
    assert "positional.table" not in state  # sinusoids are recomputed, not stored
    fresh = Transformer(small_config(), VOCAB, PAD)
    fresh.load_state_dict(state)
    assert fresh.output_projection.weight is fresh.src_embed.weight


def test_num_parameters_counts_the_architecture():
    d, ff, V, n = 16, 32, VOCAB, 2
    attention = 4 * d * d + 4 * d
    ffn = 2 * d * ff + ff + d
    norm = 2 * d
    encoder = n * (attention + ffn + 2 * norm)
    decoder = n * (2 * attention + ffn + 3 * norm)
    model = Transformer(small_config(), V, PAD)
    assert model.num_parameters() == V * d + encoder + decoder
    pre_norm = Transformer(small_config(norm_first=True), V, PAD)
    assert pre_norm.num_parameters() == V * d + encoder + decoder + 2 * norm


def test_initialisation():
    torch.manual_seed(0)
    cfg = small_config(d_model=64, d_ff=128, tie_embeddings=False)
    model = Transformer(cfg, 2000, PAD)
    emb = model.src_embed.weight
    assert torch.all(emb[PAD] == 0)
    spread = sample_std_tolerance(emb[1:].numel())  # five standard errors of a normal sample
    assert emb[1:].std().item() == pytest.approx(64**-0.5, rel=spread)
    assert model.output_projection.weight.std().item() == pytest.approx(64**-0.5, rel=spread)
    w1 = model.encoder_layers[0].ffn.linear1.weight  # xavier: U(+-sqrt(6 / (fan_in + fan_out)))
    bound = math.sqrt(6 / (64 + 128))
    assert w1.abs().max() <= bound and w1.abs().max() > 0.95 * bound
    assert torch.all(model.encoder_layers[0].ffn.linear1.bias == 0)


def test_fairseq_initialisation_keeps_pytorchs_linear_defaults_where_fairseq_does():
    """model.init fairseq: fairseq 0.12's FFN layers are plain nn.Linear (weights and biases
    U(+-1/sqrt(fan_in)), the distribution of a fresh nn.Linear), its q/k/v biases too; the rest
    is as under xavier."""
    torch.manual_seed(0)
    d, d_ff = 64, 128
    model = Transformer(small_config(d_model=d, d_ff=d_ff, init="fairseq"), 2000, PAD)
    reference = nn.Linear(d, d_ff)  # PyTorch's own default, for the spread
    for layer in [*model.encoder_layers, *model.decoder_layers]:
        for linear, fan_in in ((layer.ffn.linear1, d), (layer.ffn.linear2, d_ff)):
            for param in (linear.weight, linear.bias):
                assert 0.9 * fan_in**-0.5 < param.abs().max() <= fan_in**-0.5
        w1 = layer.ffn.linear1.weight
        # Two uniform samples of the same size: their std's standard errors add in quadrature.
        spread = 2**0.5 * sample_std_tolerance(w1.numel(), kurtosis=1.8)
        assert w1.std().item() == pytest.approx(reference.weight.std().item(), rel=spread)
        attentions = [layer.self_attn] + (
            [layer.cross_attn] if hasattr(layer, "cross_attn") else []
        )
        for attention in attentions:
            assert 0.9 * d**-0.5 < attention.in_proj.bias.abs().max() <= d**-0.5
            xavier = math.sqrt(6 / (d + 3 * d))  # the stacked (3d, d) matrix, as under xavier
            assert 0.95 * xavier < attention.in_proj.weight.abs().max() <= xavier
            assert torch.all(attention.out_proj.bias == 0)
    emb = model.src_embed.weight
    assert torch.all(emb[PAD] == 0)
    assert emb[1:].std().item() == pytest.approx(d**-0.5, rel=sample_std_tolerance(emb[1:].numel()))
    # Under xavier the same FFN has the larger Xavier bound and zero biases.
    xavier_model = Transformer(small_config(d_model=d, d_ff=d_ff), 2000, PAD)
    assert xavier_model.encoder_layers[0].ffn.linear2.weight.abs().max() > 1.5 * d_ff**-0.5


def test_max_positions_error_names_the_key():
    model = Transformer(small_config(max_positions=8), VOCAB, PAD)
    src, tgt_in = random_batch([9], [3])
    with pytest.raises(ConfigError, match="model.max_positions"):
        model(src, tgt_in)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_decoding(norm_first, speed_paths):
    model = make_model(speed_paths, norm_first=norm_first)
    src, tgt_in = random_batch([6, 3], [7, 7], seed=1)
    memory, src_pad = model.encode(src)
    full = model.decode(tgt_in, memory, src_pad)
    cache = DecoderCache()
    steps = [model.decode(tgt_in[:, : t + 1], memory, src_pad, cache) for t in range(7)]
    assert all(step.shape == (2, 1, VOCAB) for step in steps)
    # Not exact: one query and a block of queries may take different matrix kernels.
    tolerance = model_tolerance(model, src.size(1), full)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=tolerance, rtol=0)
    assert cache.length == 7


def test_cache_reorders_beams():
    model = make_model()
    src, tgt_in = random_batch([5], [4], seed=2)
    memory, src_pad = model.encode(src.expand(2, -1))  # one sentence, two beams
    prefixes = torch.stack([tgt_in[0], tgt_in[0].flip(0)])  # (2, 4), different hypotheses
    cache = DecoderCache()
    model.decode(prefixes[:, :3], memory, src_pad, cache)
    cache.reorder_beams(torch.tensor([1, 1]))  # both beams now continue hypothesis 1
    continued = torch.cat([prefixes[[1, 1], :3], tgt_in[:, 3:].expand(2, -1)], dim=1)
    last = model.decode(continued, memory, src_pad, cache)  # (2, 1, V)
    expected = model.decode(continued, memory, src_pad)[:, -1:]
    tolerance = model_tolerance(model, src.size(1), expected)
    torch.testing.assert_close(last, expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_beams_sharing_one_memory_row_equal_per_beam_copies(fused, speed_paths):
    """Beam search passes one encoder row per sentence for its k beams: the logits (cached and
    not), the cache after dropping a sentence, and the attention weights equal the per-beam copies."""
    model = make_model(speed_paths, fused_attention=fused)
    src, tgt_in = random_batch([6, 4], [5, 5], seed=4)
    beams = 3
    prefixes = tgt_in.repeat_interleave(beams, dim=0)  # (6, 5): 3 beams per sentence
    prefixes[1::beams, 2:] = prefixes[1::beams, 2:].flip(1)  # the beams differ
    memory, src_pad = model.encode(src)
    copies = memory.repeat_interleave(beams, dim=0), src_pad.repeat_interleave(beams, dim=0)
    # Not exact: shared rows are multiplied as a broadcast batch, copies as their own rows.
    expected = model.decode(prefixes, *copies)
    tolerance = model_tolerance(model, src.size(1), expected)
    torch.testing.assert_close(
        model.decode(prefixes, memory, src_pad), expected, atol=tolerance, rtol=0
    )
    shared, copied = DecoderCache(), DecoderCache()
    for t in range(3):
        model.decode(prefixes[:, : t + 1], memory, src_pad, shared)
        model.decode(prefixes[:, : t + 1], *copies, copied)
    second = torch.arange(beams, 2 * beams)  # sentence 0 is done: keep sentence 1's beams
    shared.select_rows(second, torch.tensor([1]))
    copied.select_rows(second)
    last = model.decode(prefixes[second, :4], memory[1:], src_pad[1:], shared)
    expected = model.decode(prefixes[second, :4], copies[0][second], copies[1][second], copied)
    torch.testing.assert_close(last, expected, atol=model_tolerance(model, 6, expected), rtol=0)

    layer = model.decoder_layers[0]
    x = model.embed(model.tgt_embed, prefixes)
    mask = ~src_pad[:, None, None, :]
    out, weights = layer.cross_attn(x, memory, attn_mask=mask, need_weights=True)
    out_ref, weights_ref = layer.cross_attn(
        x, copies[0], attn_mask=~copies[1][:, None, None, :], need_weights=True
    )
    torch.testing.assert_close(out, out_ref, atol=model_tolerance(model, 6, out_ref), rtol=0)
    torch.testing.assert_close(weights, weights_ref)
    with pytest.raises(ValueError, match="4 query rows cannot share 3 memory rows"):
        layer.cross_attn(x[:4], memory[[0, 1, 1]])


def test_cross_attention_weights():
    model = make_model()
    src, tgt_in = random_batch([6, 4], [5, 3], seed=3)
    src, tgt_in = src[1:], tgt_in[1:]  # (1, 6) with 2 pads, (1, 5)
    weights = model.cross_attention_weights(src, tgt_in)
    assert weights.shape == (2, 4, 5, 6)  # (layers, heads, T, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    assert torch.all(weights[..., 4:] == 0)
    # The weights are the ones the forward pass uses: recompute layer 0 with torch's MHA.
    memory, src_pad = model.encode(src)
    layer = model.decoder_layers[0]
    x = model.embed(model.tgt_embed, tgt_in)
    y, _ = layer.self_attn(x, causal=True)
    x = layer.self_attn_residual(x, y)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    from tests.test_layers import _copy_attention

    with torch.no_grad():
        _copy_attention(layer.cross_attn, mha)
    _, expected = mha(x, memory, memory, key_padding_mask=src_pad, average_attn_weights=False)
    # Weights (at most 1) after an embedding, a self-attention block and a projection.
    tolerance = model_tolerance(model, src.size(1), x, memory)
    torch.testing.assert_close(weights[0], expected[0], atol=tolerance, rtol=0)


def test_num_parameters_counts_head_dim_apart_from_width():
    """model.head_dim: W^Q, W^K, W^V are (h d_k, d_model) with h d_k biases, W^O (d_model, h d_k)."""
    d, ff, V, n, heads, d_k = 16, 32, VOCAB, 2, 3, 8  # h d_k = 24: heads need not divide d
    attention = 3 * heads * d_k * (d + 1) + (heads * d_k + 1) * d
    ffn = 2 * d * ff + ff + d
    norm = 2 * d
    encoder = n * (attention + ffn + 2 * norm)
    decoder = n * (2 * attention + ffn + 3 * norm)
    model = Transformer(small_config(heads=heads, head_dim=d_k), V, PAD)
    assert model.num_parameters() == V * d + encoder + decoder


def test_the_default_head_dim_is_d_model_over_heads_bit_for_bit():
    """head_dim None builds the same parameters from the same seed as head_dim = d_model / h,
    in the layout of torch's MultiheadAttention, and computes the same logits."""
    torch.manual_seed(5)
    default = Transformer(small_config(), VOCAB, PAD).eval()
    torch.manual_seed(5)
    explicit = Transformer(small_config(head_dim=4), VOCAB, PAD).eval()
    state, other = default.state_dict(), explicit.state_dict()
    assert list(state) == list(other)
    assert all(torch.equal(state[name], other[name]) for name in state)
    assert state["encoder_layers.0.self_attn.in_proj.weight"].shape == (3 * 16, 16)
    src, tgt_in = random_batch([6, 3], [5, 4])
    assert torch.equal(default(src, tgt_in), explicit(src, tgt_in))


@pytest.mark.parametrize("heads,head_dim", [(4, 8), (3, 2)])
def test_head_dim_apart_from_width_caches_and_shares_memory_as_the_full_pass(
    heads, head_dim, speed_paths
):
    """d_k != d_model / h: cached decoding equals the full pass, and beams sharing one memory
    row equal per-beam copies."""
    model = make_model(speed_paths, heads=heads, head_dim=head_dim)
    src, tgt_in = random_batch([6, 3], [7, 7], seed=1)
    memory, src_pad = model.encode(src)
    full = model.decode(tgt_in, memory, src_pad)
    cache = DecoderCache()
    steps = [model.decode(tgt_in[:, : t + 1], memory, src_pad, cache) for t in range(7)]
    tolerance = model_tolerance(model, src.size(1), full)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=tolerance, rtol=0)
    assert cache.layers[0].self_attn.keys.shape == (2, heads, 7, head_dim)
    beams = 2
    prefixes = tgt_in.repeat_interleave(beams, dim=0)
    copies = memory.repeat_interleave(beams, dim=0), src_pad.repeat_interleave(beams, dim=0)
    expected = model.decode(prefixes, *copies)
    tolerance = model_tolerance(model, src.size(1), expected)
    torch.testing.assert_close(
        model.decode(prefixes, memory, src_pad), expected, atol=tolerance, rtol=0
    )


def test_beam_search_with_head_dim_apart_from_width_equals_recomputation(speed_paths):
    from pipeline.model.decoding import beam_search
    from tests.test_decoding import beam_score_tolerance, decode_kwargs

    torch.manual_seed(0)
    cfg = small_config(d_model=32, heads=2, head_dim=24, max_positions=40)
    model = install_speed_paths(Transformer(cfg, VOCAB, PAD), speed_paths).eval()
    randomize(model)
    src, _ = random_batch([9, 5, 2, 7], [1, 1, 1, 1], seed=6)
    kwargs = dict(beam_size=4, length_penalty=0.6, nbest=4, **decode_kwargs(max_len_b=6))
    cached = beam_search(model, src, **kwargs, use_cache=True)
    recomputed = beam_search(model, src, **kwargs, use_cache=False)
    for row, (ours, reference) in enumerate(zip(cached, recomputed)):
        assert [h.tokens for h in ours] == [h.tokens for h in reference]
        for a, b in zip(ours, reference):
            tolerance = beam_score_tolerance(model, src[row : row + 1], b.tokens, 0.6)
            assert a.score == pytest.approx(b.score, abs=tolerance)


def _save_model_checkpoint(path, model: Transformer, config: dict) -> None:
    from pipeline.training.checkpoint_io import AtomicCheckpointIO
    from pipeline.training.checkpoints import MODEL_PREFIX

    state = {MODEL_PREFIX + name: value for name, value in model.state_dict().items()}
    hyper = {"config": config, "vocab_size": model.vocab_size}
    AtomicCheckpointIO().save_checkpoint(
        {"global_step": 1, "hyper_parameters": hyper, "state_dict": state}, path
    )


def test_checkpoints_with_and_without_head_dim_load_average_and_resume(make_config, tmp_path):
    """A checkpoint whose config has no model.head_dim (written before the key) loads as the
    default model and resumes as the same run; one with head_dim loads, averages and resumes
    only under the same head_dim."""
    from pipeline.config import to_dict
    from pipeline.evaluation.model_loading import load_model
    from pipeline.model.transformer import build_transformer
    from pipeline.training.checkpoints import MODEL_PREFIX, average_checkpoints
    from pipeline.training.resume import config_differences

    cfg = make_config("model.heads=4")
    older = to_dict(cfg)
    del older["model"]["head_dim"]
    torch.manual_seed(0)
    model = build_transformer(cfg, VOCAB).eval()
    _save_model_checkpoint(tmp_path / "older.ckpt", model, older)
    loaded = load_model(tmp_path / "older.ckpt")
    assert loaded.cfg.head_dim is None
    src, tgt_in = random_batch([5, 3], [4, 2])
    assert torch.equal(loaded(src, tgt_in), model(src, tgt_in))
    assert config_differences(older, cfg) == ([], [])

    wide = make_config("model.heads=4", "+model.head_dim=8")
    paths = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        paths.append(tmp_path / f"wide-{seed}.ckpt")
        _save_model_checkpoint(paths[-1], build_transformer(wide, VOCAB), to_dict(wide))
    first = load_model(paths[0])
    assert first.encoder_layers[0].self_attn.in_proj.weight.shape == (3 * 4 * 8, wide.model.d_model)
    averaged = average_checkpoints(paths)
    second = load_model(paths[1])
    for name, value in first.state_dict().items():
        expected = (value.double() + second.state_dict()[name].double()) / 2
        torch.testing.assert_close(averaged[MODEL_PREFIX + name].double(), expected)
    build_transformer(wide, VOCAB).load_state_dict(
        {name.removeprefix(MODEL_PREFIX): value for name, value in averaged.items()}
    )
    assert config_differences(to_dict(wide), wide) == ([], [])
    assert config_differences(older, wide)[0] == ["model.head_dim"]
