"""`train.precision: auto`: train in bf16-mixed only where it is faster than 32-bit.

A GPU with bf16 (Ampere and newer) always gains. A CPU is not told by its flags: with AMX,
bf16 matrix products are much faster than float32; with AVX512-BF16 alone they can be faster
or slower depending on the machine (docs/training.md has the measured figures); without
either, torch emulates them far slower. So on a CPU with the instructions, `auto` times the
matrix products of the model's
feed-forward layer both ways (interleaved, median) and keeps bf16 only above
`runtime.bf16_min_speedup`.

The choice is made once per job: it is kept (with the sizes it was made for) in an environment
variable that DDP's worker processes inherit, so that every rank trains in the same precision.
"""

from __future__ import annotations

import os
import statistics
import time
from functools import cache

import torch

from pipeline.environment import CPU_BF16_FLAGS, cpu_flags

CHOICE_VARIABLE = "PIPELINE_AUTO_PRECISION"  # the decision, for DDP's worker processes
PROBE_REPEATS = 9  # interleaved rounds; the median ratio decides
PROBE_ROWS = 4096  # tokens in the probe's batch: a training batch's order of magnitude


def cpu_has_bf16_instructions() -> bool:
    """AMX or AVX512-BF16, through oneDNN: bf16 matmuls in hardware, not emulated."""
    return torch.backends.mkldnn.is_available() and bool(cpu_flags() & set(CPU_BF16_FLAGS))


@cache
def bf16_speedup(d_model: int, d_ff: int, rows: int = PROBE_ROWS) -> float:
    """float32 time / bf16-autocast time of x @ W1 @ W2 on the CPU ((rows, d_model) through
    (d_model, d_ff) and back), the median over interleaved rounds: > 1 when bf16 is faster."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d_model, generator=generator)
    w1 = torch.randn(d_model, d_ff, generator=generator)
    w2 = torch.randn(d_ff, d_model, generator=generator)

    def seconds(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            (x @ w1) @ w2
        return time.perf_counter() - start

    for bf16 in (False, True):  # first calls create the oneDNN kernels
        seconds(bf16)
    ratios = [seconds(False) / seconds(True) for _ in range(PROBE_REPEATS)]
    return statistics.median(ratios)


def has_fast_bf16(device_type: str, d_model: int, d_ff: int, min_speedup: float) -> bool:
    """Whether bf16 autocast beats float32 on this device for a model of these sizes."""
    if device_type in ("gpu", "cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return cpu_has_bf16_instructions() and bf16_speedup(d_model, d_ff) >= min_speedup
    return False


def resolve_precision(
    requested: str, accelerator: str, *, d_model: int, d_ff: int, min_speedup: float
) -> str:
    """`auto`: bf16-mixed where `has_fast_bf16`, else 32-true; anything else as given."""
    if requested != "auto":
        return requested
    question = f"{accelerator}:{d_model}:{d_ff}:{min_speedup}"
    asked, _, answer = os.environ.get(CHOICE_VARIABLE, "").partition("=")
    if asked == question:
        return answer
    fast = has_fast_bf16(accelerator, d_model, d_ff, min_speedup)
    choice = "bf16-mixed" if fast else "32-true"
    os.environ[CHOICE_VARIABLE] = f"{question}={choice}"
    return choice
