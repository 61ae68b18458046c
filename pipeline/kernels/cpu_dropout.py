"""Dropout with a cheaper mask on a CPU: the values `torch.nn.Dropout` computes, inverted
dropout y = x * m / (1 - p) with m ~ Bernoulli(1 - p), identity in eval mode.

Drawing the mask is most of dropout's cost on a CPU, and with dropout after every sublayer a
large share of a small Transformer's training step (`benchmarks/train_throughput.py`). Here the
mask compares 16-bit slices of random 64-bit integers, one draw per four entries, several times
cheaper than torch's `bernoulli_` or `torch.rand`; p is therefore rounded to a multiple of
2^-15 (0.3 -> 0.299988). The default generator is used throughout, so seeding and the
checkpointed RNG state reproduce the mask exactly. Tensors elsewhere (a GPU) take
`torch.nn.functional.dropout`.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor, nn
from torch.nn import functional as F

MASK_BITS = 15  # mask entries compare 16-bit slices of random integers: p in steps of 2^-15


class CpuDropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p={p} must be in [0, 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        keep = keep_mask(x.shape, self.p)
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """Bool mask of `shape` on the CPU, each entry True with probability 1 - p (p rounded to
    a multiple of 2^-15)."""
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
