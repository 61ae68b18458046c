"""`make params` / `make repro`: params.yaml recomposed from conf/, saying which experiment it
holds and which one it replaced."""

from __future__ import annotations

import pytest
import yaml

from pipeline import params
from pipeline.errors import ConfigError


def test_a_leftover_preset_is_replaced_by_the_default_and_named(tmp_path):
    path = tmp_path / "params.yaml"
    params.write(["experiment=smoke"], path)  # what `dvc exp run -S experiment=smoke` leaves
    said = params.write([], path)
    default = yaml.safe_load(path.read_text())["experiment_name"]
    assert default != "smoke"
    assert f"experiment '{default}', recomposed from conf/ (the default)" in said
    assert "it held experiment 'smoke'" in said
    assert params.write([], path).endswith("as composed from conf/ (the default)")


def test_a_bad_override_is_refused_and_the_file_kept(tmp_path):
    path = tmp_path / "params.yaml"
    params.write([], path)
    before = path.read_text()
    with pytest.raises(ConfigError, match="model.heads"):
        params.write(["model.heads=3"], path)
    assert path.read_text() == before


def test_a_key_added_to_a_recorded_section_is_put_back_without_printing_the_section(
    tmp_path, monkeypatch
):
    """`dvc exp run -S +model.headz=8` refused by the check stage: the `model` section the last
    run recorded is put back (without `headz`), and the message names it, not its values."""
    monkeypatch.setenv("DVC_EXP_NAME", "refused")
    path, lock = tmp_path / "params.yaml", tmp_path / "dvc.lock"
    recorded = {"model": {"heads": 4, "d_model": 128}, "seed": 1}
    lock.write_text(yaml.safe_dump({"stages": {"train": {"params": {"params.yaml": recorded}}}}))
    path.write_text(yaml.safe_dump({"model": {"heads": 4, "d_model": 128, "headz": 8}, "seed": 1}))
    said = params.put_back("model.headz", path, lock)
    assert yaml.safe_load(path.read_text()) == recorded
    assert said == f"{path}: 'model' put back to its value in the last run ({lock})"
