"""Speed paths that pay on one kind of host, kept out of the paper-reading modules.

The model (`pipeline.model`) is built as the paper reads: `torch.nn.Dropout` after every
sublayer, torch's fused attention kernel. `install_speed_paths` then switches host-specific
paths on in the built model, all in this one place (as `keep_linear_defaults_as_fairseq` adjusts
a built model for `model.init: fairseq`); each still decides per tensor, and only runs for
tensors on a CPU:
- `cpu_dropout`: dropout masks drawn from 16-bit slices of random int64 words
  (`pipeline.kernels.cpu_dropout`), p rounded to a multiple of 2^-15;
- `cpu_attention`: the explicit attention formula instead of torch's fused kernel under
  bf16/fp16 autocast and for a single query (`pipeline.kernels.cpu_attention`).

Training installs them from `runtime.cpu_speed_paths` (`SpeedPaths.on_cpu`); off, a CPU run
takes the path a GPU takes, so the tests run both paths against the same oracles. Dropout's
mask stream differs between the two, so a resumed run keeps `runtime.cpu_speed_paths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from torch import nn

from pipeline.kernels.cpu_attention import cpu_scaled_dot_product_attention
from pipeline.kernels.cpu_dropout import CpuDropout
from pipeline.model.attention import MultiHeadAttention, scaled_dot_product_attention

ModuleT = TypeVar("ModuleT", bound=nn.Module)


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


def install_speed_paths(model: ModuleT, paths: SpeedPaths) -> ModuleT:
    """`model` (returned) taking exactly `paths`, switched in place, on or off.

    Modules change, never a parameter or buffer, so the state_dict is the paper model's and
    loads before or after. Every dropout below the root becomes `CpuDropout` or `nn.Dropout`
    with its p and training mode (neither draws random numbers when built, so the mask stream
    is the one a model built with the path draws); every `MultiHeadAttention` computes with
    `cpu_scaled_dot_product_attention` or the paper's function.
    """
    dropout = CpuDropout if paths.cpu_dropout else nn.Dropout
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in (nn.Dropout, CpuDropout) and type(child) is not dropout:
                setattr(parent, name, dropout(child.p).train(child.training))
    attention = (cpu_scaled_dot_product_attention if paths.cpu_attention
                 else scaled_dot_product_attention)  # fmt: skip
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.attention = attention
    return model


def speed_paths_of(model: nn.Module) -> SpeedPaths:
    """The speed paths `model` takes: each one on where every module it concerns takes it."""
    modules = list(model.modules())
    dropouts = [type(m) for m in modules if type(m) in (nn.Dropout, CpuDropout)]
    attention = [m.attention for m in modules if isinstance(m, MultiHeadAttention)]
    return SpeedPaths(
        cpu_dropout=bool(dropouts) and all(t is CpuDropout for t in dropouts),
        cpu_attention=bool(attention)
        and all(a is cpu_scaled_dot_product_attention for a in attention),
    )
