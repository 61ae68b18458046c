"""pipeline.experiments: the DVC experiments one line each, at any terminal width (the real
`dvc exp show` of two queued experiments: tests/test_dvc_pipeline.py)."""

from __future__ import annotations

import pytest

from pipeline.experiments import Row, cli, table


def rows() -> list[Row]:
    many = {f"train.key_{i}": str(i) for i in range(12)}
    return [
        Row("a-rather-long-experiment-name", {"experiment": "smoke", **many}, 3.1, 2.95, 40, 174),
        Row("best", {"model.heads": "2", **many}, 40.04, 39.66, 7000, 4323.2),
        Row("main", {}, None, None, None, None),
        Row("queued-one", {"model.heads": "8"}, None, None, None, None, "queued"),
    ]


@pytest.mark.parametrize("width", [80, 100, 200])
def test_every_line_fits_and_keeps_the_numbers(width):
    lines = table(rows(), width).splitlines()
    assert max(len(line) for line in lines) <= width
    assert lines[1].split()[:2] == ["experiment", "changed"]
    best, long, *rest = lines[2:]
    assert best.startswith("best ") and best.split()[-4:] == ["40.0", "39.7", "7000", "72.1"]
    assert long.startswith("a-rather-long-exper…") and long.split()[-4:] == ["3.1", "3.0", "40",
                                                                            "2.9"]  # fmt: skip
    # the value that tells the experiments apart before the ones they share
    assert best.split()[1] == "model.heads=2" and long.split()[1] == "experiment=smoke"
    assert any(line.startswith("queued-one") and "queued" in line for line in rest)
    assert any(line.startswith("main") and "(its preset)" in line for line in rest)


@pytest.mark.parametrize(("width", "said"), [("0", "must be >= 1, got 0"),
                                             ("-5", "must be >= 1, got -5"),
                                             ("wide", "must be an integer >= 1, got 'wide'")])  # fmt: skip
def test_a_width_below_one_column_is_a_usage_error_before_dvc_runs(width, said, capsys):
    with pytest.raises(SystemExit) as exited:
        cli(["--width", width])
    assert exited.value.code == 2
    assert f"argument --width: {said}" in capsys.readouterr().err
