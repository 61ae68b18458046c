"""Where training runs: the strategy and device count a `train` config resolves to."""

from __future__ import annotations

from pipeline.training.hardware import device_count, resolve_strategy


def test_hardware_resolution():
    assert resolve_strategy("auto", 1, 1) == "auto"
    assert resolve_strategy("auto", 2, 1) == "ddp"
    assert resolve_strategy("auto", 1, 2) == "ddp"
    assert resolve_strategy("fsdp", 2, 1) == "fsdp"
    assert device_count(2, "cpu") == 2
    assert device_count([0, 1, 3], "gpu") == 3
    assert device_count("auto", "cpu") == 1
    assert device_count("0,1", "gpu") == 2
