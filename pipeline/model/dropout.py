"""Section 5.4, residual dropout: "We apply dropout to the output of each sub-layer ... In
addition, we apply dropout to the sums of the embeddings and the positional encodings".

Inverted dropout, y = x * m / (1 - p) with m ~ Bernoulli(1 - p), identity in eval mode: the
values `torch.nn.Dropout` computes. Drawing the mask is most of dropout's cost on a CPU, and
with dropout after every sublayer it is a large share of a Transformer-tiny training step
(`benchmarks/train_throughput.py`). For a (191, 22, 128) activation on a 2-core Xeon, torch's
CPU dropout kernel (`bernoulli_`) took ~19 ns per entry and `torch.rand` 7-11 ns; on a CPU the
mask here compares 16-bit slices of random 64-bit integers, one draw per four entries (~3 ns
per entry, 2-3x faster than `torch.rand`), so p is rounded to a multiple of 2^-15
(0.3 -> 0.299988). Same default generator throughout, so seeding and the
checkpointed RNG state reproduce it exactly. Elsewhere (a GPU) `torch.rand` is already cheap;
`pipeline.cpu_paths` switches the CPU path off.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor, nn

from pipeline import cpu_paths

MASK_BITS = 15  # mask entries compare 16-bit slices of random integers: p in steps of 2^-15


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p={p} must be in [0, 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = keep_mask(x.shape, self.p, x.device)
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """Bool mask of `shape`, each entry True with probability 1 - p (p rounded to 2^-15 on a CPU)."""
    if not cpu_paths.enabled_for(device):
        return torch.rand(shape, device=device) >= p
    count = math.prod(shape)
    # random_() on int64 fills [0, 2^63): of the four 16-bit slices of each number, three are
    # uniform over [-2^15, 2^15) and the most significant one, lacking the sign bit, over
    # [0, 2^15). Each gets the threshold it passes with probability 1 - dropped / 2^15.
    dropped = min(round(p * 2**MASK_BITS), 2**MASK_BITS - 1)  # p < 1 keeps some: int16 bound
    thresholds = [2 * dropped - 2**MASK_BITS] * 4
    thresholds[3 if sys.byteorder == "little" else 0] = dropped
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_()
    slices = words.view(torch.int16).view(-1, 4)
    keep = slices >= torch.tensor(thresholds, dtype=torch.int16)
    return keep.view(-1)[:count].view(shape)
