"""An exported folder loaded and decoded by CTranslate2, as our own search decodes.

`translate_with_ctranslate2` decodes as `pipeline.model.decoding` does: greedy search for beam
1, else CTranslate2's beam search, which keeps the same candidates as ours (the best 2k, eos
among the best k finishes a hypothesis, a sentence ends with k finished), and our length limit
a * src_len + b per sentence (`max_decoding_length` is one number per call, so sentences are
grouped by their limit). Three of our rules are not CTranslate2 options, and are matched so:

- length penalty: CTranslate2 ranks by log P / |Y| ** alpha, we by GNMT's
  log P / ((5 + |Y|) / 6) ** alpha (|Y| counting eos in both). Its search does not depend on
  alpha (unless 0: it then stops at the first finished beam), so all k finished hypotheses are
  asked for and re-ranked by GNMT.
- the length limit: our beam search appends eos to the live beams there (scoring log P(eos));
  CTranslate2 ends them without. Those hypotheses are rescored with eos (`score_batch`).
- pad and bos: we never generate them, but our scores keep the softmax over the whole
  vocabulary. CTranslate2's `suppress_sequences` renormalises without them, which shifts every
  score, so they are not suppressed: never targets, a trained model gives them next to no
  probability (a translation that contains one is logged as a warning).
Left unmatched: which hypotheses CTranslate2 returns is decided by its own penalty (k of up to
2k - 1 finished), and the live beams that a finished one displaces at the limit are not
returned; both change the result only when CTranslate2's and GNMT's rankings disagree near the
top. Sources longer than `model.max_positions` tokens are cut there by both, but CTranslate2
keeps the source eos last (we cut it). `tests/test_export.py` checks that every hypothesis
either search returns gets the same score from both models, and that the translations are the
same or differ only in these ways or on a tie of the float32 arithmetic.
`nbest_with_ctranslate2` returns CTranslate2's k hypotheses so ranked, `score_with_ctranslate2`
the exported model's log-probs of given hypotheses.

"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.data.tokenizer import Tokenizer, pretokenizer_path
from pipeline.errors import DataError
from pipeline.export.conversion import EXPORT_INFO, ctranslate2_module

log = logging.getLogger(__name__)

# CTranslate2's length penalty for alpha = 0: its own 0 stops at the first finished beam;
# |Y| ** 1e-6 is 1 to within 1e-5, so it ranks by log P, as GNMT's formula with alpha = 0.
MIN_CT2_LENGTH_PENALTY = 1e-6


@dataclass
class ExportedModel:
    """An export folder loaded for decoding."""

    translator: object  # ctranslate2.Translator
    tokenizer: Tokenizer  # with the model's source_eos and pre-tokenization
    max_positions: int  # the length rule's cap


def load_exported(
    model_dir: str | Path, *, device: str = "cpu", compute_type: str = "default", threads: int = 1
) -> ExportedModel:
    """`compute_type` "default" computes in the stored weight type (float32, int8, ...)."""
    info_path = Path(model_dir) / EXPORT_INFO
    if not info_path.is_file():
        raise DataError(f"{info_path} not found: export a model with `python -m pipeline.export`")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    translator = ctranslate2_module().Translator(
        str(model_dir), device=device, compute_type=compute_type, intra_threads=threads
    )
    spm_model = Path(model_dir) / info["tokenizer"]
    tokenizer = Tokenizer.load(spm_model, source_eos=info["source_eos"])
    recorded = info.get("pretokenizer")  # absent from folders exported before it was recorded
    if recorded is not None and recorded != asdict(tokenizer.pretokenizer):
        raise DataError(
            f"{pretokenizer_path(spm_model)}: the folder's subword model reads "
            f"{tokenizer.pretokenizer.describe()}, but {info_path} records {recorded}; export "
            "the model again"
        )
    return ExportedModel(translator, tokenizer, info["max_positions"])


def max_output_length(src_len: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """`pipeline.model.decoding.max_output_lengths` of one sentence (src_len with its eos)."""
    return min(max(int(np.floor(max_len_a * src_len + max_len_b)), 0), max_positions - 1)


def translate_with_ctranslate2(
    exported: ExportedModel, src_ids: Sequence[Sequence[int]], **search
) -> list:
    """`src_ids` as `Tokenizer.encode_sources` returns them (what our `translate_ids` reads)
    -> one `pipeline.model.decoding.Hypothesis` per sentence: the tokens (no bos/eos) and
    length-normalised score our beam search (greedy search for beam 1) gives it. `search`: the
    keywords of `nbest_with_ctranslate2`, whose best hypothesis this is."""
    from pipeline.model.decoding import Hypothesis

    nbest = nbest_with_ctranslate2(exported, src_ids, **search)
    results = [hypotheses[0] if hypotheses else Hypothesis([], 0.0) for hypotheses in nbest]
    tokenizer = exported.tokenizer
    never = {tokenizer.pad_id, tokenizer.bos_id}
    generated = sum(bool(never & set(h.tokens)) for h in results)
    if generated:
        log.warning(
            "%d translation(s) contain pad or bos, which our search never generates (an "
            "untrained model?): they differ from pipeline.model.decoding's",
            generated,
        )
    return results


def nbest_with_ctranslate2(
    exported: ExportedModel,
    src_ids: Sequence[Sequence[int]],
    *,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    max_tokens: int = 0,
    length_normalization: str = "gnmt",
) -> list[list]:
    """Every hypothesis CTranslate2 returns: for each sentence its `beam_size` finished
    hypotheses (one for beam 1, none for an empty source or a limit of 0 tokens), rescored and
    ranked by our length normalisation, best first; settings as in conf/eval (`length_penalty`
    is alpha of `length_normalization`). `max_tokens`: source tokens per CTranslate2 batch (0:
    each group of sentences with one length limit is one batch)."""
    from pipeline.model.decoding import Hypothesis
    from pipeline.model.length_penalty import length_normalizer

    tokenizer, limit, translator = exported.tokenizer, exported.max_positions, exported.translator
    groups: dict[int, list[int]] = {}  # sentence indices by their length limit
    for i, ids in enumerate(src_ids):
        if ids:  # an empty source translates to nothing, as in translate_ids
            max_len = max_output_length(min(len(ids), limit), max_len_a, max_len_b, limit)
            groups.setdefault(max_len, []).append(i)
    ct2_penalty = length_penalty or MIN_CT2_LENGTH_PENALTY
    results: list[list] = [[] for _ in src_ids]
    for max_len, indices in groups.items():
        if max_len == 0:  # only eos is allowed: an empty translation (CTranslate2 needs >= 1)
            continue
        sources = [_source_pieces(src_ids[i], tokenizer) for i in indices]
        outputs = translator.translate_batch(
            sources,
            beam_size=beam_size,
            num_hypotheses=beam_size,
            length_penalty=ct2_penalty,
            max_decoding_length=max_len,
            min_decoding_length=0,
            max_input_length=limit,
            return_scores=True,
            return_end_token=True,
            max_batch_size=max_tokens,
            batch_type="tokens",
        )
        # Its k best finished hypotheses: (ids, ending in eos unless cut at the limit; log P).
        nbest = [
            [
                (_ids(pieces, tokenizer), score * len(pieces) ** ct2_penalty)
                for pieces, score in zip(output.hypotheses, output.scores)
            ]
            for output in outputs
        ]
        _rescore_at_limit(translator, tokenizer, sources, nbest, limit)
        for i, hypotheses in zip(indices, nbest):
            ranked = [
                Hypothesis(_strip_eos(ids, tokenizer),
                           log_prob / length_normalizer(_with_eos(ids, tokenizer), length_penalty,
                                                        length_normalization))
                for ids, log_prob in hypotheses
            ]  # fmt: skip
            results[i] = sorted(ranked, key=lambda h: h.score, reverse=True)
    return results


def score_with_ctranslate2(
    exported: ExportedModel, src_ids: Sequence[Sequence[int]], hypotheses: Sequence[Sequence[int]]
) -> list[list[float]]:
    """The exported model's log-probs of each hypothesis's tokens (no bos/eos) followed by eos,
    teacher-forced (`score_batch`), for sources as `translate_with_ctranslate2` reads them:
    `pipeline.evaluation.beam_decoding.hypothesis_log_probs`' entries, computed by CTranslate2."""
    tokenizer = exported.tokenizer
    sources = [_source_pieces(ids, tokenizer) for ids in src_ids]
    return _log_probs(exported.translator, tokenizer, sources, hypotheses, exported.max_positions)


def _log_probs(translator, tokenizer: Tokenizer, sources, hypotheses, limit: int) -> list:
    """Per-token log-probs of `hypotheses` (ids without eos; score_batch adds it)."""
    scored = translator.score_batch(
        sources, [[tokenizer.piece(t) for t in ids] for ids in hypotheses], max_input_length=limit
    )
    return [list(result.log_probs) for result in scored]


def _rescore_at_limit(translator, tokenizer: Tokenizer, sources, nbest, limit: int) -> None:
    """Hypotheses cut at the length limit get eos appended and log P(... eos), in place: our
    beam search ends them so."""
    eos = tokenizer.eos_id
    cut = [(s, h) for s, hyps in enumerate(nbest) for h, (ids, _) in enumerate(hyps)
           if not ids or ids[-1] != eos]  # fmt: skip
    if not cut:
        return
    scored = _log_probs(translator, tokenizer, [sources[s] for s, _ in cut],
                        [nbest[s][h][0] for s, h in cut], limit)  # fmt: skip
    for (s, h), log_probs in zip(cut, scored):
        nbest[s][h] = ([*nbest[s][h][0], eos], float(sum(log_probs)))


def _source_pieces(ids: Sequence[int], tokenizer: Tokenizer) -> list[str]:
    ids = list(ids)
    if tokenizer.source_eos and ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]  # CTranslate2 adds it (config add_source_eos)
    return [tokenizer.piece(t) for t in ids]


def _ids(pieces: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    return [tokenizer.processor.piece_to_id(piece) for piece in pieces]


def _with_eos(ids: list[int], tokenizer: Tokenizer) -> int:
    """|Y| of the length penalty: the tokens and eos."""
    return len(ids) + (not ids or ids[-1] != tokenizer.eos_id)


def _strip_eos(ids: list[int], tokenizer: Tokenizer) -> list[int]:
    return ids[:-1] if ids and ids[-1] == tokenizer.eos_id else ids
