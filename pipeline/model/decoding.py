"""Inference (section 6.1): greedy decoding and beam search, batched over sentences and beams.

Beam search follows fairseq: at each step the beams' cumulative log-probs are extended by every
token, the best 2k candidates are kept; those ending in eos within the best k become finished
hypotheses, the best k others continue. A sentence is done when it has k finished hypotheses or
reaches its maximum length (where only eos is allowed). Finished hypotheses are ranked by the
length-normalised score of GNMT (Wu et al. 2016), as the paper's "length penalty alpha = 0.6":

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

(or fairseq's lp(Y) = |Y| ** alpha: `pipeline.model.length_penalty`)

with |Y| counting the generated tokens including the final eos. The maximum output length is
a * src_len + b tokens (src_len = the sentence's non-pad source tokens), capped so that every
position fits in `model.max_positions`.

The model needs `encode(src) -> (memory, src_pad_mask)`, `decode(tgt_in, memory, src_pad_mask,
cache) -> logits` whose last position predicts the next token, and `pad_id`, `cfg.max_positions`.
Beam search passes one memory row per sentence for its k consecutive beam rows of `tgt_in`
(the encoder output is read once per sentence, not copied per beam).
With `use_cache` a `DecoderCache` carries keys/values between steps; without it every step
re-decodes the whole prefix (slower; a reference for tests and benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipeline.model.length_penalty import LENGTH_NORMALIZATIONS
from pipeline.model.transformer import DecoderCache


@dataclass
class Hypothesis:
    """One translation: token ids without bos/eos, and its length-normalised log-probability."""

    tokens: list[int]
    score: float


def max_output_lengths(model: nn.Module, src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """(B,) the most tokens (eos excluded) each sentence may generate: a * src_len + b, capped
    by the positional table (position 0 is bos, so at most max_positions - 1 tokens)."""
    src_len = src.ne(model.pad_id).sum(dim=1)
    limit = (max_len_a * src_len.double() + max_len_b).floor().long()
    return limit.clamp(min=0, max=model.cfg.max_positions - 1)


def _next_log_probs(
    model: nn.Module,
    tokens: Tensor,
    memory: Tensor,
    src_pad_mask: Tensor,
    cache: DecoderCache | None,
    banned: list[int],
) -> Tensor:
    """(rows, t) prefixes -> (rows, V) float32 log-probs of the next token, banned ids at -inf."""
    logits = model.decode(tokens, memory, src_pad_mask, cache)[:, -1]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    log_probs[:, banned] = float("-inf")
    return log_probs


TOPK_BLOCK = 512  # columns per block of `blockwise_topk` (each block's max is one vector pass)


def blockwise_topk(scores: Tensor, m: int, block: int = TOPK_BLOCK) -> tuple[Tensor, Tensor]:
    """`scores.topk(m, dim=1)` for (rows, width) with m << width, a few times faster on a CPU,
    where torch's top-k over a row runs at a fraction of memory bandwidth: beam search takes
    the best 2k of k * vocab candidates every step.

    The m best entries of a row lie in the m blocks with the largest block maxima (any entry
    outside them is beaten by those m maxima). So: one max per block of `block` columns, the
    top m blocks, then top-k over their m * block entries plus the last partial block.
    Values equal `torch.topk`'s; indices too, up to the order of ties.
    """
    rows, width = scores.shape
    full_blocks = width // block
    if full_blocks <= m:
        return scores.topk(m, dim=1)
    blocks = scores[:, : full_blocks * block].view(rows, full_blocks, block)
    best_blocks = blocks.amax(dim=2).topk(m, dim=1).indices  # (rows, m)
    gathered = blocks.gather(1, best_blocks[:, :, None].expand(-1, -1, block))  # (rows, m, block)
    tail = scores[:, full_blocks * block :]  # (rows, width % block)
    values, positions = torch.cat([gathered.view(rows, m * block), tail], dim=1).topk(m, dim=1)
    in_blocks = positions < m * block
    column = best_blocks.gather(1, (positions // block).clamp(max=m - 1)) * block
    column += positions % block
    indices = torch.where(in_blocks, column, positions - m * block + full_blocks * block)
    return values, indices


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len_a: float,
    max_len_b: int,
    use_cache: bool = True,
) -> list[list[int]]:
    """The most probable next token at every step. src (B, S) -> B token lists (no bos/eos)."""
    batch = src.size(0)
    memory, src_pad_mask = model.encode(src)
    max_lens = max_output_lengths(model, src, max_len_a, max_len_b)
    banned = [model.pad_id, bos_id]
    tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    cache = DecoderCache() if use_cache else None
    for step in range(int(max_lens.max()) + 1):
        log_probs = _next_log_probs(model, tokens, memory, src_pad_mask, cache, banned)
        next_token = log_probs.argmax(dim=-1)  # (B,)
        next_token = torch.where(step >= max_lens, eos_id, next_token)  # length limit: stop
        next_token = torch.where(finished, model.pad_id, next_token)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    outputs = []
    for row in tokens[:, 1:].tolist():
        outputs.append(row[: row.index(eos_id)] if eos_id in row else row)
    return outputs


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    nbest: int = 1,
    use_cache: bool = True,
    length_normalization: str = "gnmt",
) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence its `nbest` best hypotheses, best first.
    `length_penalty` is alpha of `length_normalizer(..., length_normalization)`; 0 ranks by
    summed log-prob."""
    alpha, k = length_penalty, beam_size
    normalizer = LENGTH_NORMALIZATIONS[length_normalization]
    batch, device = src.size(0), src.device
    memory, src_pad_mask = model.encode(src)
    max_lens = max_output_lengths(model, src, max_len_a, max_len_b).tolist()
    banned = [model.pad_id, bos_id]

    # Row s * k + j holds beam j of the s-th sentence still searched; sentence ids in `active`.
    # memory (B, S, D) keeps one row per sentence, shared by its k beams' cross-attention.
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((batch, k), float("-inf"), device=device)  # summed log-probs
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    active = list(range(batch))
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    cache = DecoderCache() if use_cache else None
    step = 0
    while active:
        n = len(active)
        log_probs = _next_log_probs(model, tokens, memory, src_pad_mask, cache, banned)
        vocab = log_probs.size(-1)
        log_probs = log_probs.view(n, k, vocab)
        at_limit = [step >= max_lens[s] for s in active]
        if any(at_limit):  # only eos for those sentences (a full (n, k, V) pass: not every step)
            only_eos = torch.full((vocab,), float("-inf"), device=device)
            only_eos[eos_id] = 0.0
            at_limit = torch.tensor(at_limit, device=device)
            log_probs.add_(torch.where(at_limit[:, None, None], only_eos, 0.0))

        # In place: each (n, k, V) tensor allocated per step costs page faults on the CPU.
        candidates = log_probs.add_(scores[:, :, None]).view(n, k * vocab)
        top_scores, top_ids = blockwise_topk(candidates, 2 * k)  # (n, 2k), best first
        origin, token = top_ids // vocab, top_ids % vocab  # beam it extends, token it adds
        ends = token == eos_id

        # eos among the best k: a finished hypothesis (the prefix, scored with its eos).
        for i, j in (ends[:, :k] & top_scores[:, :k].isfinite()).nonzero().tolist():
            sentence = finished[active[i]]
            if len(sentence) < k:
                prefix = tokens[i * k + origin[i, j], 1:].tolist()
                total = top_scores[i, j].item()
                sentence.append(Hypothesis(prefix, total / normalizer(len(prefix) + 1, alpha)))

        # The best k candidates not ending in eos continue (at most k of the 2k end in eos).
        rank = torch.arange(2 * k, device=device)
        keep = (ends.long() * 2 * k + rank).argsort(dim=1)[:, :k]  # (n, k)
        scores = top_scores.gather(1, keep)
        rows = (torch.arange(n, device=device)[:, None] * k + origin.gather(1, keep)).view(-1)
        tokens = torch.cat([tokens[rows], token.gather(1, keep).view(-1, 1)], dim=1)
        if cache is not None:
            cache.reorder_beams(rows)

        done = [len(finished[s]) >= k or step >= max_lens[s] for s in active]
        step += 1
        if any(done):
            kept = [i for i, is_done in enumerate(done) if not is_done]
            active = [active[i] for i in kept]
            kept_sentences = torch.tensor(kept, dtype=torch.long, device=device)
            kept_rows = (kept_sentences[:, None] * k + torch.arange(k, device=device)).view(-1)
            scores = scores[kept_sentences]
            tokens, memory = tokens[kept_rows], memory[kept_sentences]
            src_pad_mask = src_pad_mask[kept_sentences]
            if cache is not None:
                cache.select_rows(kept_rows, kept_sentences)

    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]
