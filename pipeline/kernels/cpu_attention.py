"""Where torch's fused attention kernel loses to the explicit formula on a CPU.

Under bf16/fp16 autocast the CPU kernel's backward is several times slower than the explicit
formula with bf16 matmuls (`benchmarks/train_throughput.py`), and for a single query (a
cached decoding step) it is slower in fp32 too (`benchmarks/decode_throughput.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.model.attention import scaled_dot_product_attention


def explicit_attention_pays(q: Tensor) -> bool:
    """Whether the explicit formula beats the fused kernel for queries `q` (B, h, T_q, d_k)."""
    if q.device.type != "cpu":
        return False
    return q.dtype in (torch.bfloat16, torch.float16) or q.size(-2) == 1


def cpu_scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, *, fused: bool = True, **options
) -> tuple[Tensor, Tensor | None]:
    """`scaled_dot_product_attention`, taking the explicit formula wherever it is the faster
    one (`explicit_attention_pays`): the same function, computed on another path."""
    fused = fused and not explicit_attention_pays(q)
    return scaled_dot_product_attention(q, k, v, fused=fused, **options)
