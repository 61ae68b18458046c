"""Section 5.4, residual dropout: "We apply dropout to the output of each sub-layer ... In
addition, we apply dropout to the sums of the embeddings and the positional encodings".

Inverted dropout, y = x * m / (1 - p) with m ~ Bernoulli(1 - p), identity in eval mode: the
values `torch.nn.Dropout` computes. The mask comes from `torch.rand(...) >= p` rather than
torch's CPU dropout kernel (`bernoulli_`), which draws its random numbers ~3x slower: with
dropout after every sublayer that is ~15% of a Transformer-tiny training step on a CPU
(`benchmarks/train_throughput.py`). Same default generator, so seeding and the checkpointed
RNG state reproduce it exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p={p} must be in [0, 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, device=x.device) >= self.p  # float32 uniforms for any dtype
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"
