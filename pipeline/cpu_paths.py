"""The seam between the paper-reading code and the speed paths that only pay on a CPU.

Three places take another path on a CPU than the one a GPU takes:
- dropout draws its mask from 16-bit slices of random int64 words (`pipeline.model.dropout`);
- attention under bf16 autocast, or for a single query, runs the explicit formula instead of
  torch's fused kernel (`pipeline.model.attention`);
- training sets glibc's heap thresholds and oneDNN's kernel cache (`pipeline.training.cpu_memory`).

Each asks `enabled_for(device)`. With `train.cpu_speed_paths: false` (`set_enabled(False)`;
`generic()` in tests) a CPU run takes the generic path, the one CUDA runs, so that path is
tested on a CPU with the same oracles as the fast one. Dropout's mask stream differs between
the two paths, so a run does not switch paths when it resumes (`train.cpu_speed_paths` is a
key a resumed run must keep).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_enabled = True


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = bool(enabled)


def enabled_for(device: torch.device | str) -> bool:
    """Whether a CPU-only speed path may run for tensors on `device`."""
    return _enabled and torch.device(device).type == "cpu"


@contextlib.contextmanager
def configured(enabled: bool) -> Iterator[None]:
    """The CPU speed paths on (`enabled`) or off while inside; as before afterwards."""
    before = _enabled
    set_enabled(enabled)
    try:
        yield
    finally:
        set_enabled(before)


def generic() -> contextlib.AbstractContextManager[None]:
    """The generic (GPU) paths on every device while inside."""
    return configured(False)
