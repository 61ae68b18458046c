"""Section 5.4, residual dropout: "We apply dropout to the output of each sub-layer ... In
addition, we apply dropout to the sums of the embeddings and the positional encodings".

Inverted dropout, y = x * m / (1 - p) with m ~ Bernoulli(1 - p), identity in eval mode:
`torch.nn.Dropout`. With `SpeedPaths.cpu_dropout` the same values come from a mask that is
cheaper to draw on a CPU (`pipeline.kernels.cpu_dropout`).
"""

from __future__ import annotations

from torch import nn

from pipeline.kernels import PAPER, SpeedPaths


def dropout_module(p: float, speed_paths: SpeedPaths = PAPER) -> nn.Module:
    """Dropout with probability `p`: `torch.nn.Dropout(p)` unless the CPU path is on."""
    if speed_paths.cpu_dropout:
        from pipeline.kernels.cpu_dropout import CpuDropout

        return CpuDropout(p)
    return nn.Dropout(p)
