"""Greedy and beam search: on hand-built distributions with known answers (exhaustive search as
the reference), and on a real Transformer (cache vs recomputation, beam 1 vs greedy, lengths)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from pipeline.config_schema import ModelConfig
from pipeline.kernels import SpeedPaths, install_speed_paths
from pipeline.model.decoding import (
    Hypothesis,
    beam_search,
    blockwise_topk,
    greedy_decode,
)
from pipeline.model.length_penalty import length_normalizer
from pipeline.model.transformer import Transformer
from pipeline.rounding import float32_tolerance, log_prob_tolerance
from tests.test_layers import randomize, small_config

PAD, UNK, BOS, EOS = 0, 1, 2, 3
A, B_, C = 4, 5, 6  # "real" tokens of the hand-built models
VOCAB = 7


class TableModel(nn.Module):
    """Same interface as Transformer, but P(next | prefix) is given: `table` for chosen prefixes
    (unlisted tokens get a tiny probability), `elsewhere` for the rest: a {token: prob} dict, or
    "random" for a seeded random distribution per (sentence, prefix). The sentence is its first
    source token, carried through `memory`, so the sentences of a batch can differ."""

    pad_id = PAD

    def __init__(self, table=None, *, elsewhere=None, max_positions=64):
        super().__init__()
        self.cfg = ModelConfig(max_positions=max_positions)
        self.table = table or {}
        self.elsewhere = elsewhere or {EOS: 0.99}
        self.calls = 0

    def encode(self, src):
        return src[:, :1].float()[:, :, None], src.eq(PAD)  # memory (B, 1, 1): the sentence id

    def distribution(self, sentence: int, prefix: tuple[int, ...]) -> torch.Tensor:
        """(V,) log P(next | sentence, prefix)."""
        given = self.table.get(prefix, self.elsewhere)
        if given == "random":
            gen = torch.Generator().manual_seed(hash((sentence, prefix)) % 2**31)
            probs = torch.rand(VOCAB, generator=gen) ** 2
        else:
            probs = torch.full((VOCAB,), 1e-6)
            for token, p in given.items():
                probs[token] = p
        return (probs / probs.sum()).log()

    def decode(self, tgt_in, memory, src_pad_mask, cache=None):
        self.calls += 1
        beams = tgt_in.size(0) // memory.size(0)  # beam search: one memory row per sentence
        sentences = memory[:, 0, 0].long().repeat_interleave(beams).tolist()
        rows = [self.distribution(s, tuple(row[1:])) for s, row in zip(sentences, tgt_in.tolist())]
        return torch.stack(rows)[:, None]  # (rows, 1, V): the next-token log-probs

    def log_prob(self, sentence: int, tokens: list[int]) -> float:
        """log P(tokens + eos) under the table: the reference for beam scores."""
        total, prefix = 0.0, ()
        for token in [*tokens, EOS]:
            total += self.distribution(sentence, prefix)[token].item()
            prefix = (*prefix, token)
        return total


def table_score_tolerance(score: float, tokens: list[int]) -> float:
    """How far beam search's float32 score may lie from `TableModel.log_prob`'s float64 sum of
    the same float32 log-probs: one float32 sum of len(tokens) + 1 terms and one division by the
    length normaliser. All terms are <= 0, so their sizes add up to |score| (normalised or not,
    the bound is relative)."""
    return float32_tolerance(len(tokens) + 2, abs(score))


def decode_kwargs(**overrides):
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len_a=0.0, max_len_b=5)
    return {**kwargs, **overrides}


def sources(*first_tokens: int, length: int = 3) -> torch.Tensor:
    return torch.tensor([[first] + [A] * (length - 1) for first in first_tokens])


# Greedy takes A (0.6) but then only reaches P = 0.6 * 0.4; beam search finds B_ with 0.4 * 0.9.
GREEDY_TRAP = {
    (): {A: 0.6, B_: 0.4},
    (A,): {EOS: 0.4, B_: 0.3, C: 0.3},
    (B_,): {EOS: 0.9, A: 0.1},
}


def test_beam_search_beats_greedy_when_greedy_is_suboptimal():
    model = TableModel(GREEDY_TRAP)
    src = sources(A)
    assert greedy_decode(model, src, **decode_kwargs(), use_cache=False) == [[A]]
    (best,) = beam_search(model, src, beam_size=2, length_penalty=0.0, **decode_kwargs())[0]
    assert best.tokens == [B_]
    expected = model.log_prob(A, [B_])
    assert best.score == pytest.approx(expected, abs=table_score_tolerance(expected, [B_]))
    # log(0.4 * 0.9) but for the 1e-6 the table gives each unlisted token: two steps
    # renormalised by at most 1 + VOCAB * 1e-6 each.
    assert expected == pytest.approx(math.log(0.4 * 0.9), abs=2 * VOCAB * 1e-6)
    assert best.score > model.log_prob(A, [A])  # greedy's sequence scores lower


def test_length_penalty_changes_the_choice_as_the_formula_says():
    # Short: [] (eos at once, P 0.5).  Long: [A, A] (P 0.5 * 0.9 * 0.9).
    table = {(): {EOS: 0.5, A: 0.5}, (A,): {A: 0.9, B_: 0.1}, (A, A): {EOS: 0.9}}
    model = TableModel(table)
    src = sources(A)
    short, long_ = model.log_prob(A, []), model.log_prob(A, [A, A])
    for alpha in [0.0, 0.6, 1.0, 2.0]:
        hyps = beam_search(
            model, src, beam_size=2, length_penalty=alpha, nbest=2, **decode_kwargs()
        )[0]
        expected = {
            (): short / length_normalizer(1, alpha),
            (A, A): long_ / length_normalizer(3, alpha),
        }
        winner = max(expected, key=expected.get)
        assert tuple(hyps[0].tokens) == winner, alpha
        for hyp in hyps:
            if tuple(hyp.tokens) in expected:
                score = expected[tuple(hyp.tokens)]
                tolerance = table_score_tolerance(score, hyp.tokens)
                assert hyp.score == pytest.approx(score, abs=tolerance)
    # The switch happens where the formula says: short wins at alpha 0, long at alpha 2.
    assert short > long_ and short < long_ / length_normalizer(3, 2.0)


@pytest.mark.parametrize(
    ("alpha", "normalization"), [(0.0, "gnmt"), (1.0, "gnmt"), (1.0, "fairseq"), (2.0, "fairseq")]
)
def test_wide_beam_equals_exhaustive_search(alpha, normalization):
    """With more beams than prefixes, beam search is exact: its n-best list must equal the
    best hypotheses of an enumeration of every sequence up to the length limit, each scored by
    the normalization's formula written out here."""
    model = TableModel(elsewhere="random")
    max_len, tokens = 3, [UNK, EOS, A, B_, C]  # pad and bos are never generated
    src = sources(A, B_, C)
    results = beam_search(
        model, src, beam_size=200, length_penalty=alpha, nbest=6,
        length_normalization=normalization, **decode_kwargs(max_len_b=max_len),
    )  # fmt: skip
    formula = {"gnmt": lambda n: ((5 + n) / 6) ** alpha, "fairseq": lambda n: n**alpha}
    real = [t for t in tokens if t != EOS]
    for sentence, hyps in zip([A, B_, C], results):
        every = [list(seq) for n in range(max_len + 1) for seq in itertools.product(real, repeat=n)]
        scored = sorted(
            (model.log_prob(sentence, seq) / formula[normalization](len(seq) + 1), seq)
            for seq in every
        )[::-1][:6]
        assert [h.tokens for h in hyps] == [seq for _, seq in scored]
        for hyp, (score, _) in zip(hyps, scored):
            assert hyp.score == pytest.approx(score, abs=table_score_tolerance(score, hyp.tokens))


def test_nbest_is_sorted_and_distinct():
    model = TableModel(elsewhere="random")
    results = beam_search(
        model, sources(A, B_), beam_size=5, length_penalty=0.6, nbest=5, **decode_kwargs()
    )
    for hyps in results:
        assert len(hyps) == 5 and all(isinstance(h, Hypothesis) for h in hyps)
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5


def test_max_length_per_sentence():
    model = TableModel(elsewhere={A: 1.0, B_: 1e-3, C: 1e-3})  # eos (almost) never
    src = torch.tensor([[A, A, A, A], [A, A, PAD, PAD], [A, PAD, PAD, PAD]])  # 4, 2, 1 tokens
    kwargs = decode_kwargs(max_len_a=1.5, max_len_b=1)  # floor(1.5 * len + 1) = 7, 4, 2
    assert [len(t) for t in greedy_decode(model, src, **kwargs, use_cache=False)] == [7, 4, 2]
    results = beam_search(model, src, beam_size=3, length_penalty=1.0, nbest=3, **kwargs)
    assert [[len(h.tokens) for h in hyps] for hyps in results] == [[7] * 3, [4] * 3, [2] * 3]
    # The positional table caps it: at most max_positions - 1 tokens after bos.
    model.cfg.max_positions = 4
    assert [len(t) for t in greedy_decode(model, src, **kwargs, use_cache=False)] == [3, 3, 2]


def test_search_stops_when_every_beam_is_finished():
    model = TableModel()  # eos with probability 0.99 after any prefix
    beam_search(
        model, sources(A, B_), beam_size=3, length_penalty=1.0, **decode_kwargs(max_len_b=50)
    )
    assert model.calls <= 3


# --- on a real (random) Transformer --------------------------------------------------------


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    model = Transformer(small_config(d_model=32, heads=4, max_positions=40), 40, PAD).eval()
    randomize(model)
    with torch.no_grad():  # a bit of preference for eos, so that hypotheses end at various lengths
        model.output_projection.weight[EOS] *= 3
    return model


@pytest.fixture(scope="module")
def source_batch():
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (4, 9), generator=gen)
    for row, length in enumerate([9, 5, 2, 7]):
        src[row, length:] = PAD
    return src


def with_speed_paths(model: Transformer, speed_paths: SpeedPaths) -> Transformer:
    """The same weights, with `speed_paths` installed."""
    rebuilt = Transformer(model.cfg, model.vocab_size, model.pad_id)
    install_speed_paths(rebuilt, speed_paths)
    rebuilt.load_state_dict(model.state_dict())
    return rebuilt.eval()


def beam_score_tolerance(
    model: Transformer, src_row, tokens: list[int], alpha: float, normalization: str = "gnmt"
) -> float:
    """How far two float32 evaluations of the model may put a hypothesis' beam score: the
    `log_prob_tolerance` of its teacher-forced rows, over the length normaliser."""
    target = torch.tensor([[BOS, *tokens, EOS]])
    with torch.no_grad():
        rows = model(src_row, target[:, :-1]).log_softmax(-1)[0]
    keys = max(src_row.size(1), target.size(1))
    normalizer = length_normalizer(len(tokens) + 1, alpha, normalization)
    return log_prob_tolerance(model, rows, keys) / normalizer


def test_cached_beam_search_equals_recomputation(transformer, source_batch, speed_paths):
    transformer = with_speed_paths(transformer, speed_paths)
    kwargs = dict(
        beam_size=4, length_penalty=0.6, nbest=4, **decode_kwargs(max_len_a=1.2, max_len_b=4)
    )
    cached = beam_search(transformer, source_batch, **kwargs, use_cache=True)
    recomputed = beam_search(transformer, source_batch, **kwargs, use_cache=False)
    lengths = {len(h.tokens) for hyps in cached for h in hyps}
    assert len(lengths) > 2  # the check covers hypotheses ending at different steps
    # Not exact: one query and a block of queries may take different matrix kernels.
    for row, (ours, reference) in enumerate(zip(cached, recomputed)):
        assert [h.tokens for h in ours] == [h.tokens for h in reference]
        for a, b in zip(ours, reference):
            tolerance = beam_score_tolerance(
                transformer, source_batch[row : row + 1], b.tokens, 0.6
            )
            assert a.score == pytest.approx(b.score, abs=tolerance)


def test_cached_greedy_equals_recomputation_and_beam_one(transformer, source_batch, speed_paths):
    transformer = with_speed_paths(transformer, speed_paths)
    kwargs = decode_kwargs(max_len_a=1.2, max_len_b=4)
    cached = greedy_decode(transformer, source_batch, **kwargs)
    assert cached == greedy_decode(transformer, source_batch, **kwargs, use_cache=False)
    beam_one = beam_search(transformer, source_batch, beam_size=1, length_penalty=1.0, **kwargs)
    assert [hyps[0].tokens for hyps in beam_one] == cached


def test_beam_scores_are_the_model_log_probs(transformer, source_batch):
    """Each hypothesis' score = log P(tokens + eos | src) / lp, recomputed with one forward."""
    alpha = 0.6
    results = beam_search(
        transformer,
        source_batch,
        beam_size=3,
        length_penalty=alpha,
        nbest=3,
        **decode_kwargs(max_len_a=1.0, max_len_b=3),
    )
    for row, hyps in enumerate(results):
        for hyp in hyps:
            target = torch.tensor([[BOS, *hyp.tokens, EOS]])
            logits = transformer(source_batch[row : row + 1], target[:, :-1])
            log_probs = logits.log_softmax(-1)[0].gather(1, target[0, 1:, None]).sum().item()
            expected = log_probs / length_normalizer(len(hyp.tokens) + 1, alpha)
            tolerance = beam_score_tolerance(transformer, source_batch[row : row + 1],
                                             hyp.tokens, alpha)  # fmt: skip
            assert hyp.score == pytest.approx(expected, abs=tolerance)


def test_empty_source_decodes_without_nan(transformer):
    src = torch.tensor([[PAD, PAD, PAD], [5, 6, 7]])
    results = beam_search(transformer, src, beam_size=2, length_penalty=1.0, **decode_kwargs())
    assert all(math.isfinite(hyps[0].score) for hyps in results)
    assert len(results[0][0].tokens) <= 5


@pytest.mark.parametrize(
    "width, m, block",
    [(50_000, 10, 512), (10_007, 10, 512), (5_130, 6, 64), (1_000, 10, 512), (300, 4, 16)],
)
def test_blockwise_topk_equals_torch_topk(width, m, block):
    """Beam search's top 2k of k * vocab: the same values and indices as torch.topk, for widths
    that split into whole blocks or leave a partial one, with fewer blocks than m (torch.topk
    itself), and rows mostly -inf (a sentence at its length limit, the first step's beams)."""
    generator = torch.Generator().manual_seed(width)
    scores = torch.randn(5, width, generator=generator)
    scores[0, 3 * block :] = float("-inf")  # the best entries all in the first blocks
    scores[1, : width - 2] = float("-inf")  # only the last two columns (the tail) are finite
    scores[2, width - 1] = 100.0  # the best entry in the tail
    values, indices = blockwise_topk(scores, m, block)
    expected_values, expected_indices = scores.topk(m, dim=1)
    assert torch.equal(values, expected_values)
    finite = expected_values.isfinite()
    assert torch.equal(indices[finite], expected_indices[finite])  # -inf ties: any order
    assert torch.equal(scores.gather(1, indices), values)
