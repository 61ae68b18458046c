"""Speed paths that pay on one kind of host, kept out of the paper-reading modules.

The model (`pipeline.model`) is written as the paper reads: `torch.nn.Dropout` after every
sublayer, torch's fused attention kernel. A `SpeedPaths` passed to `Transformer` (and from it
to each layer that has a choice) switches host-specific paths on; each one still decides per
tensor, and only runs for tensors on a CPU:
- `cpu_dropout`: dropout masks drawn from 16-bit slices of random int64 words
  (`pipeline.kernels.cpu_dropout`), p rounded to a multiple of 2^-15;
- `cpu_attention`: the explicit attention formula instead of torch's fused kernel under
  bf16/fp16 autocast and for a single query (`pipeline.kernels.cpu_attention`).

Training builds them from `runtime.cpu_speed_paths` (`SpeedPaths.on_cpu`); off, a CPU run takes
the path a GPU takes, so the tests run both paths against the same oracles. Dropout's mask
stream differs between the two, so a resumed run keeps `runtime.cpu_speed_paths`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeedPaths:
    """Which CPU-only speed paths the model may take (all off: the paper's path)."""

    cpu_dropout: bool = False
    cpu_attention: bool = False

    @classmethod
    def on_cpu(cls, enabled: bool) -> SpeedPaths:
        """Every CPU speed path on (`runtime.cpu_speed_paths: true`) or off."""
        return cls(cpu_dropout=enabled, cpu_attention=enabled)


PAPER = SpeedPaths()
