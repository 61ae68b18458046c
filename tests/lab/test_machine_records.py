"""benchmarks/machine_records.py: one record per run and machine, named and listed by when the
run finished, with the machine's class as the tables show it."""

from __future__ import annotations

import pytest

from benchmarks import machine_records
from pipeline import environment


def entry(commit: str, finished: str, hardware: str = "CPU, 2 cores") -> dict:
    return {"provenance": {"commit": commit, "hardware": hardware},
            "cpu": {"family": "25", "model": "1"}, "finished": finished}  # fmt: skip


def test_records_are_named_by_day_commit_and_class_and_listed_as_they_finished(tmp_path):
    """Not by commit hash or file name: a later run at an alphabetically earlier commit is last."""
    later = entry("aaa1111", "2026-01-02T10:00:00+00:00")
    earlier = entry("fff0000", "2026-01-02T09:00:00+00:00")
    paths = [machine_records.write(tmp_path, e) for e in (later, earlier)]
    assert [p.name for p in paths] == ["2026-01-02.aaa1111.family25-model1.json",
                                       "2026-01-02.fff0000.family25-model1.json"]  # fmt: skip
    assert machine_records.load(tmp_path) == [earlier, later]


def test_a_second_run_of_one_day_commit_and_class_is_kept_beside_the_first(tmp_path):
    """Two settings compared on one machine (pytest workers, say): neither record is lost."""
    first = entry("aaa1111", "2026-01-02T10:00:00+00:00")
    second = {**entry("aaa1111", "2026-01-02T10:00:00+00:00"), "setting": 3}  # the same second
    third = entry("aaa1111", "2026-01-02T12:00:00+00:00")
    paths = [machine_records.write(tmp_path, e) for e in (first, second, third)]
    assert [p.name for p in paths] == ["2026-01-02.aaa1111.family25-model1.json",
                                       "2026-01-02.aaa1111.family25-model1.2.json",
                                       "2026-01-02.aaa1111.family25-model1.3.json"]  # fmt: skip
    assert machine_records.load(tmp_path) == [first, second, third]


def test_this_machine_is_recorded_with_its_cpu_family_and_model():
    cpu = environment.cpuinfo()
    recorded = machine_records.machine()
    assert recorded["cpu"] == {"family": cpu.get("cpu family"), "model": cpu.get("model")}
    assert recorded["finished"].endswith("+00:00")


@pytest.mark.parametrize(
    ("hardware", "named"),
    [("AMD EPYC, 2 cores", "AMD EPYC, no bf16"),
     ("AMD EPYC, 2 cores, avx512_bf16", "AMD EPYC, avx512_bf16"),
     ("Intel Xeon, 2 cores, amx_bf16/avx512_bf16", "Intel Xeon, amx_bf16/avx512_bf16")],
)  # fmt: skip
def test_a_machine_without_bf16_kernels_is_named_so(hardware, named):
    """The hardware string lists bf16 flags only where they are; the label says their absence."""
    label = machine_records.machine_label(entry("abc1234", "2026-01-02T09:00:00+00:00", hardware))
    assert label == f"{named} (family 25, model 1)"
