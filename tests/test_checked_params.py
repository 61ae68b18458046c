"""pipeline.checked_params: params.yaml put back as the last passing check stage read it."""

from __future__ import annotations

import yaml

from pipeline import checked_params
from pipeline.dvc_env import DVC_EXP_NAME


def test_a_key_added_with_plus_is_said_to_be_removed_not_put_back_to_none(tmp_path, monkeypatch):
    monkeypatch.setenv(DVC_EXP_NAME, "refused")
    path, copy = tmp_path / "params.yaml", tmp_path / "params.checked.yaml"
    passed = {"model": {"heads": 4, "checkpoint": None}, "seed": 1}
    copy.write_text(yaml.safe_dump(passed))
    path.write_text(yaml.safe_dump({"model": {"heads": 4, "checkpoint": None, "headz": 8},
                                    "seed": 1}))  # fmt: skip
    said = checked_params.put_back("model.headz", path, copy, tmp_path / "no.lock")
    assert path.read_text() == copy.read_text()
    assert said.startswith(f"{path}: 'model.headz' removed and every other value put back as")
    # A key the passing file holds, even as null, is put back to its value.
    path.write_text(yaml.safe_dump({"model": {"heads": 4, "checkpoint": "x.ckpt"}, "seed": 1}))
    said = checked_params.put_back("model.checkpoint", path, copy, tmp_path / "no.lock")
    assert said.startswith(f"{path}: 'model.checkpoint' put back to None and every other value")
