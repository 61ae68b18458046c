import math
import os

import pytest

from pipeline.training.precision import (
    CHOICE_VARIABLE,
    bf16_speedup,
    cpu_has_bf16_instructions,
    resolve_precision,
)

SIZES = {"d_model": 32, "d_ff": 64}


@pytest.fixture(autouse=True)
def no_inherited_choice(monkeypatch):
    monkeypatch.delenv(CHOICE_VARIABLE, raising=False)


def test_explicit_precisions_are_kept_and_only_cpus_and_gpus_get_bf16():
    assert resolve_precision("16-mixed", "gpu", **SIZES, min_speedup=1.1) == "16-mixed"
    assert resolve_precision("32-true", "cpu", **SIZES, min_speedup=0.0) == "32-true"
    assert resolve_precision("auto", "mps", **SIZES, min_speedup=0.0) == "32-true"


def test_the_probe_times_both_dtypes():
    speedup = bf16_speedup(SIZES["d_model"], SIZES["d_ff"], rows=256)
    assert math.isfinite(speedup) and 0.0 < speedup < 1000.0


def test_auto_on_a_cpu_follows_the_instructions_and_the_measured_speedup(monkeypatch):
    # Any measured speedup clears a threshold of 0; none clears 1e9.
    has_bf16 = cpu_has_bf16_instructions()
    expected = "bf16-mixed" if has_bf16 else "32-true"
    assert resolve_precision("auto", "cpu", **SIZES, min_speedup=0.0) == expected
    monkeypatch.delenv(CHOICE_VARIABLE)
    assert resolve_precision("auto", "cpu", **SIZES, min_speedup=1e9) == "32-true"


def test_the_choice_is_kept_for_the_processes_of_the_same_job(monkeypatch):
    first = resolve_precision("auto", "cpu", **SIZES, min_speedup=1e9)
    assert first == "32-true"
    assert os.environ[CHOICE_VARIABLE] == f"cpu:32:64:{1e9}=32-true"
    # A DDP worker inherits the decision instead of timing again (and maybe disagreeing).
    monkeypatch.setenv(CHOICE_VARIABLE, f"cpu:32:64:{1e9}=bf16-mixed")
    assert resolve_precision("auto", "cpu", **SIZES, min_speedup=1e9) == "bf16-mixed"
    # Other sizes (a sweep trial) are decided afresh.
    assert resolve_precision("auto", "cpu", d_model=16, d_ff=32, min_speedup=1e9) == "32-true"
