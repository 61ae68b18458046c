"""Section 6.1's length penalty: what beam search divides a finished hypothesis's summed
log-probability by, |Y| counting its eos. Free of torch, so that `pipeline.config` validates
`eval.length_normalization` against these names without importing the model."""

from __future__ import annotations

LENGTH_NORMALIZATIONS = {
    # GNMT (Wu et al. 2016, section 7): lp(Y) = ((5 + |Y|) / 6) ** alpha
    "gnmt": lambda length, alpha: ((5 + length) / 6) ** alpha,
    # |Y| ** alpha: fairseq-generate's --lenpen, CTranslate2's length_penalty
    "fairseq": lambda length, alpha: length**alpha,
}


def length_normalizer(length: int, alpha: float, normalization: str = "gnmt") -> float:
    """lp(Y) of a hypothesis of `length` tokens under `normalization` (LENGTH_NORMALIZATIONS)."""
    return LENGTH_NORMALIZATIONS[normalization](length, alpha)
