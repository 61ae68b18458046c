"""Beam search over many sentences: sources batched by length within `eval.max_tokens`, each
sentence's n-best list detokenized; and a model's teacher-forced log-probs of given
hypotheses, batched the same way (what a beam search scores them by)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline import console
from pipeline.config_schema import EvalConfig
from pipeline.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One source sentence's n-best list: detokenized text, subword ids and beam scores."""

    texts: list[str]
    tokens: list[list[int]]
    scores: list[float]

    @property
    def best(self) -> str:
        return self.texts[0] if self.texts else ""


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that each batch's padded source (sentences x longest)
    stays within `max_tokens`; sorting by length keeps the padding small. Empty sentences
    are left out (they translate to an empty line)."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)  # the first index of a batch is its longest sentence
        else:
            batches.append([i])
    return batches


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, longest) LongTensor, right-padded with pad_id."""
    batch = torch.full((len(sequences), max(map(len, sequences))), pad_id, dtype=torch.long)
    for row, ids in enumerate(sequences):
        batch[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return batch


def translate_ids(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    src_ids: Sequence[Sequence[int]],
    eval_cfg: EvalConfig,
    desc: str = "decode",
    progress: bool = True,
) -> list[Translation]:
    """Beam-search every source (`Tokenizer.encode_sources` ids), batched by `eval.max_tokens`.

    Sources longer than the model's `max_positions` are cut there (with a warning). Batches
    go to the model's device, with a progress bar on stderr unless `progress` is false.
    Returns one Translation per source, in input order.
    """
    from pipeline.model.decoding import beam_search

    device = next(model.parameters()).device

    limit = model.cfg.max_positions
    too_long = sum(len(ids) > limit for ids in src_ids)
    if too_long:
        log.warning("%d source sentence(s) longer than %d subwords were truncated", too_long, limit)
    src_ids = [list(ids[:limit]) for ids in src_ids]
    results = [Translation([], [], []) for _ in src_ids]
    batches = length_batches([len(ids) for ids in src_ids], eval_cfg.max_tokens)
    with torch.inference_mode():
        shown = (
            console.track(batches, desc=desc, unit="batch", leave=False) if progress else batches
        )
        for batch in shown:
            src = pad_batch([src_ids[i] for i in batch], tokenizer.pad_id).to(device)
            nbest_lists = beam_search(
                model,
                src,
                bos_id=tokenizer.bos_id,
                eos_id=tokenizer.eos_id,
                beam_size=eval_cfg.beam_size,
                length_penalty=eval_cfg.length_penalty,
                length_normalization=eval_cfg.length_normalization,
                max_len_a=eval_cfg.max_len_a,
                max_len_b=eval_cfg.max_len_b,
                nbest=eval_cfg.nbest,
            )
            for i, hypotheses in zip(batch, nbest_lists):
                results[i] = Translation(
                    texts=[one_line(tokenizer.decode(h.tokens)) for h in hypotheses],
                    tokens=[list(h.tokens) for h in hypotheses],
                    scores=[float(h.score) for h in hypotheses],
                )
    return results


@torch.no_grad()
def hypothesis_log_probs(
    model: torch.nn.Module,
    src_ids: Sequence[Sequence[int]],
    hypotheses: Sequence[Sequence[int]],
    *,
    bos_id: int,
    max_tokens: int,
) -> list[torch.Tensor]:
    """The model's float32 log-probs, teacher-forced, at every position of each hypothesis
    (tokens without bos/eos) and the eos after it: (len(tokens) + 1, vocab) per hypothesis,
    row t the distribution its token t is drawn from, so the entries of its tokens and eos sum
    to log P(tokens + eos | src), what beam search scores a finished hypothesis by
    (`summed_log_prob`). Sources are cut at `model.cfg.max_positions`, as `translate_ids`
    cuts them, and batched as it batches them (`max_tokens`, e.g. `eval.max_tokens`)."""
    limit, pad_id = model.cfg.max_positions, model.pad_id
    device = next(model.parameters()).device
    sources = [list(ids)[:limit] for ids in src_ids]
    targets = [[bos_id, *tokens] for tokens in hypotheses]
    rows: list[torch.Tensor] = [torch.empty(0)] * len(targets)
    lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]  # never 0: bos
    for batch in length_batches(lengths, max_tokens):
        src = pad_batch([sources[i] for i in batch], pad_id).to(device)
        tgt_in = pad_batch([targets[i] for i in batch], pad_id).to(device)
        # A position sees only those before it: the padding after a hypothesis changes nothing.
        log_probs = torch.log_softmax(model(src, tgt_in).float(), dim=-1)
        for row, i in enumerate(batch):
            rows[i] = log_probs[row, : len(targets[i])]
    return rows


def summed_log_prob(log_probs: torch.Tensor, tokens: list[int], eos_id: int) -> float:
    """log P(tokens + eos | src) from `hypothesis_log_probs`' rows of that hypothesis."""
    target = torch.tensor([*tokens, eos_id], device=log_probs.device)
    return float(log_probs.gather(1, target[:, None]).sum())


def one_line(text: str) -> str:
    """Collapse whitespace (newlines included) so every hypothesis stays on its own line."""
    return " ".join(text.split())


def nbest_lines(translations: Sequence[Translation]) -> list[str]:
    """`sentence index <tab> beam score <tab> hypothesis`, n lines per sentence, best first."""
    return [
        f"{i}\t{score:.4f}\t{text}"
        for i, t in enumerate(translations)
        for text, score in zip(t.texts, t.scores)
    ]
