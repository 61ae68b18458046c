"""pipeline.config_reference: the JSON Schema of params.yaml and the reference table of
docs/configuration-keys.md are what the schema's classes make, and params.yaml is inside its schema
(named on its first line, for editors)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline import config as config_lib
from pipeline import config_reference, config_schema, docs_blocks
from tests.conftest import REPO_ROOT


def test_the_committed_json_schema_is_the_generated_one():
    committed = (REPO_ROOT / "conf" / "params.schema.json").read_text()
    assert committed == config_reference.schema_text(), (
        "stale: run `python -m pipeline.config_reference --update-docs`"
    )


def test_the_docs_table_is_the_generated_one():
    committed = docs_blocks.read(REPO_ROOT / config_reference.PAGE, config_reference.BLOCK)
    assert committed == config_reference.reference_table(), (
        "stale: run `python -m pipeline.config_reference --update-docs`"
    )


def test_the_table_lists_every_key_with_its_domain_and_default():
    table = config_reference.reference_table()
    for key, _ in config_reference.leaves():
        assert f"| `{key}` |" in table
    assert "| `train.lr_factor` | number | > 0 | `2.0` |" in table
    assert "| `train.save_top_k` | integer | -1 (keep every checkpoint) or >= 1 | `10` |" in table
    assert "| `eval.splits` | array or null |" in table and "| `null` |" in table


def test_params_yaml_names_its_schema_and_is_inside_it():
    """The first line is what a YAML language server reads; the values are inside the schema
    (checked with pydantic: the jsonschema package is not installed here)."""
    text = (REPO_ROOT / "params.yaml").read_text()
    first = text.splitlines()[0]
    assert first == "# yaml-language-server: $schema=conf/params.schema.json"
    assert (REPO_ROOT / first.split("=", 1)[1]).is_file()
    values = yaml.safe_load(text)
    config_lib.ADAPTER.validate_python(values)
    assert set(values) == set(json.loads(config_reference.schema_text())["properties"])


def test_a_params_file_elsewhere_names_the_schema_relative_to_itself(tmp_path):
    from pipeline import params

    params.write([], tmp_path / "params.yaml")
    first = (tmp_path / "params.yaml").read_text().splitlines()[0]
    where = (tmp_path / first.split("=", 1)[1]).resolve()
    assert where == (REPO_ROOT / "conf" / "params.schema.json").resolve()


def test_dvcs_own_composition_holds_the_schemas_defaults(tmp_path):
    """`dvc exp run -S ...` composes conf/ itself, loading Hydra's plugins from the
    repository: it must write the same values as `python -m pipeline.params` (every key, the
    schema's defaults included), in a process that never imported the pipeline before."""
    out = tmp_path / "params.yaml"
    script = (
        "import sys; from dvc.utils.hydra import compose_and_dump; "
        f"compose_and_dump({str(out)!r}, {str(REPO_ROOT / 'conf')!r}, None, 'config', "
        f"{str(REPO_ROOT)!r}, sys.argv[1:])"
    )
    for overrides in ([], ["experiment=smoke"], ["experiment=multi30k_wu2021"]):
        result = subprocess.run([sys.executable, "-c", script, *overrides], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        composed = yaml.safe_load(OmegaConf.to_yaml(config_lib.compose_dict(overrides)))
        assert yaml.safe_load(out.read_text()) == composed, overrides


@pytest.mark.parametrize("key", ["model.head_dim", "train.max_epochs", "data.limits.max_file_mb"])
def test_a_key_conf_does_not_set_is_in_the_composition(key):
    """An override without `+` finds a key that only the schema declares (DVC's `-S` too)."""
    value = config_lib.subtree(OmegaConf.to_container(config_lib.compose_dict()), key)
    assert value == config_lib.subtree(config_schema.defaults(), key)
