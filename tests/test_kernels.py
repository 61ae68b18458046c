"""`install_speed_paths`: a host's speed paths switched on in a built model change modules only,
so when they are installed (at construction, right after it, after loading weights) changes
neither the weights nor a seeded training step's numbers, dropout's mask stream included."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch
from torch import Tensor, nn

import pipeline.model
from pipeline.kernels import PAPER, SpeedPaths, install_speed_paths, speed_paths_of
from pipeline.kernels.cpu_attention import cpu_scaled_dot_product_attention
from pipeline.kernels.cpu_dropout import CpuDropout
from pipeline.model.attention import MultiHeadAttention, scaled_dot_product_attention
from pipeline.model.transformer import Transformer
from tests.test_layers import randomize, small_config

VOCAB, PAD = 40, 0
CPU = SpeedPaths.on_cpu(True)


def config(**overrides):
    return small_config(d_model=32, heads=4, max_positions=40, dropout=0.1,
                        attention_dropout=0.1, activation_dropout=0.1, **overrides)  # fmt: skip


def trained_weights(cfg) -> dict[str, Tensor]:
    torch.manual_seed(0)
    model = Transformer(cfg, VOCAB, PAD)
    randomize(model)
    return model.state_dict()


def batch() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (4, 9), generator=gen)
    tgt = torch.randint(4, VOCAB, (4, 7), generator=gen)
    for row, length in enumerate([9, 5, 2, 7]):
        src[row, length:] = PAD
    return src, tgt


def seeded_step(model: Transformer) -> list[Tensor]:
    """A train-mode forward and backward from one seed (dropout everywhere), then a bf16
    forward continuing the random stream (where the CPU attention path differs): outputs,
    gradients and the generator's state after."""
    src, tgt = batch()
    model.train().zero_grad()
    torch.manual_seed(5)
    out = model(src, tgt)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(src, tgt)
    return [out.detach(), *grads, bf16.detach(), torch.get_rng_state()]


def built_with_cpu_dropout(cfg) -> Transformer:
    """A model whose dropouts are `CpuDropout` from its constructor on, as a model given the
    path by its constructors had them; attention's path set after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nn, "Dropout", CpuDropout)
        model = Transformer(cfg, VOCAB, PAD)
    assert type(model.dropout) is CpuDropout
    return install_speed_paths(model, CPU)


def test_no_model_constructor_takes_speed_paths():
    """The model's modules build the paper's model only; the paths come from one place."""
    taking = []
    for info in pkgutil.iter_modules(pipeline.model.__path__):
        module = importlib.import_module(f"pipeline.model.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, nn.Module):
                parameters = inspect.signature(cls.__init__).parameters
                if "speed_paths" in parameters:
                    taking.append(f"{module.__name__}.{name}{list(parameters)}")
    assert not taking


@pytest.mark.parametrize("norm_first", [False, True])
def test_paths_installed_at_any_moment_give_the_same_step(norm_first):
    """Built with CpuDropout in place, installed right after building, or installed after
    loading the weights (a resumed run): the same state_dict keys as the plain model, and
    bit for bit the same outputs, gradients and random stream."""
    cfg = config(norm_first=norm_first)
    weights = trained_weights(cfg)
    built = built_with_cpu_dropout(cfg)
    built.load_state_dict(weights)
    early = install_speed_paths(Transformer(cfg, VOCAB, PAD), CPU)
    early.load_state_dict(weights)
    late = Transformer(cfg, VOCAB, PAD)
    late.load_state_dict(weights)
    assert install_speed_paths(late, CPU) is late
    plain = Transformer(cfg, VOCAB, PAD)
    plain.load_state_dict(weights)

    for model in (built, early, late):
        assert speed_paths_of(model) == CPU and model.state_dict().keys() == weights.keys()
    reference = seeded_step(built)
    for model in (early, late):
        step = seeded_step(model)
        assert all(torch.equal(a, b) for a, b in zip(step, reference, strict=True))
    paper_step = seeded_step(plain)
    assert not torch.equal(paper_step[0], reference[0])  # the paths change the dropout masks
    assert not torch.equal(paper_step[-2], reference[-2])  # and bf16 attention


@pytest.mark.parametrize("paths", [SpeedPaths(cpu_dropout=True), SpeedPaths(cpu_attention=True)])
def test_each_path_alone_and_switched_back_off(paths):
    """One path installs without the other, and installing the paper's paths again gives the
    plain model's step bit for bit, keeping each module's training mode."""
    cfg = config()
    weights = trained_weights(cfg)
    model = install_speed_paths(Transformer(cfg, VOCAB, PAD), paths).eval()
    model.load_state_dict(weights)
    assert speed_paths_of(model) == paths
    dropouts = [m for m in model.modules() if type(m) in (nn.Dropout, CpuDropout)]
    assert {type(m) for m in dropouts} == {CpuDropout if paths.cpu_dropout else nn.Dropout}
    assert {m.p for m in dropouts} == {0.1}
    attention = {m.attention for m in model.modules() if isinstance(m, MultiHeadAttention)}
    expected = (cpu_scaled_dot_product_attention if paths.cpu_attention
                else scaled_dot_product_attention)  # fmt: skip
    assert attention == {expected}

    install_speed_paths(model, PAPER)
    assert speed_paths_of(model) == PAPER and not any(m.training for m in model.modules())
    plain = Transformer(cfg, VOCAB, PAD)
    plain.load_state_dict(weights)
    step, reference = seeded_step(model), seeded_step(plain)
    assert all(torch.equal(a, b) for a, b in zip(step, reference, strict=True))


def test_cpu_paths_agree_with_the_paper_path_in_eval_mode():
    """Eval mode, fp32, full sequences: no dropout and the fused kernel on both: equal."""
    cfg = config()
    weights = trained_weights(cfg)
    plain, fast = Transformer(cfg, VOCAB, PAD), Transformer(cfg, VOCAB, PAD)
    plain.load_state_dict(weights)
    fast.load_state_dict(weights)
    install_speed_paths(fast, CPU)
    src, tgt = batch()
    with torch.no_grad():
        assert torch.equal(fast.eval()(src, tgt), plain.eval()(src, tgt))
