"""pipeline.config_schema: every key has a domain (type, range, choices), and the check stage
refuses any value outside it, naming the key, before anything is written. The domains are read
from the JSON Schema pydantic derives from the schema's classes (`pipeline.config.json_schema`);
the values outside them are made and checked apart from pydantic (`tests.schema_values`)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from pipeline import config as config_lib
from pipeline.cli import main
from pipeline.config_reference import leaves
from pipeline.config_schema import changed
from pipeline.stages import check
from tests.conftest import set_key
from tests.schema_values import accepts, outside

LEAVES = leaves()


@functools.cache
def default_params() -> dict:
    """conf/ composed with no overrides: what params.yaml holds (valid)."""
    return OmegaConf.to_container(config_lib.compose_dict())


@functools.cache
def last_run_lock() -> dict:
    """dvc.lock as DVC writes it after a run of the default params: each stage of dvc.yaml
    records the params it declares, with their values."""
    from tests.conftest import REPO_ROOT

    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    values = default_params()

    def value(dotted: str):
        tree = values
        for part in dotted.split("."):
            tree = tree[part]
        return tree

    return {"schema": "2.0", "stages": {
        name: {"params": {"params.yaml": {key: value(key) for key in stage["params"]}}}
        for name, stage in stages.items() if stage.get("params")
    }}  # fmt: skip


def recorded_by_the_lock(key: str) -> bool:
    return any(key == name or key.startswith(f"{name}.")
               for stage in last_run_lock()["stages"].values()
               for name in stage["params"]["params.yaml"])  # fmt: skip


def names_the_key(stderr: str, key: str) -> bool:
    """`error: ... config key '<key>'...`: the key itself, or a part of it (an item, an entry)."""
    return re.search(rf"config key '{re.escape(key)}[.\['[]", stderr) is not None


def test_every_key_of_the_schema_has_a_domain():
    """A key added without a domain (a bare `str`, any value) fails here: the check stage could
    not hold it to one. Two are free text on purpose: where data is fetched from (checked
    where it is fetched) and a dataset's name on the Hugging Face hub."""
    assert len(LEAVES) > 100
    free = [name for name, schema in LEAVES if accepts(schema, "") and accepts(schema, "a b")]
    assert free == ["data.url", "data.hf_path"]
    assert all(not accepts(schema, {"a": 1}) for _, schema in LEAVES)


@pytest.mark.parametrize(("key", "schema"), LEAVES, ids=[name for name, _ in LEAVES])
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(data=st.data())
def test_a_value_outside_its_domain_is_refused_by_the_check_stage_naming_the_key(key, schema, data):
    """For every key of the schema, a value outside its domain (of the wrong type, below its
    minimum, above its maximum, not a choice, ...) in params.yaml: the check stage's entry point
    exits 2 naming the key, without a traceback, and writes nothing. Under `dvc exp run` (which
    wrote the value there) it puts the key back as the last run recorded it in dvc.lock, or
    says that params.yaml keeps the value where no run recorded the key."""
    bad = data.draw(outside(schema), label=key)
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        params = Path("params.yaml")
        params.write_text(yaml.safe_dump(set_key(default_params(), key, bad)))
        written = params.read_bytes()
        stderr = io.StringIO()
        with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(stderr):
            main(check.run, stage="check")
        assert exit.value.code == 2, stderr.getvalue()
        assert names_the_key(stderr.getvalue(), key), stderr.getvalue()
        assert [p.name for p in Path().iterdir()] == ["params.yaml"]
        assert params.read_bytes() == written

        # Under `dvc exp run -S`, which wrote the value: put back as the last run had it.
        Path("dvc.lock").write_text(yaml.safe_dump(last_run_lock()))
        stderr = io.StringIO()
        with (
            pytest.raises(SystemExit) as exit,
            contextlib.redirect_stderr(stderr),
            mock_environ(DVC_EXP_NAME="brave-moth"),
        ):
            main(check.run, stage="check")
        assert exit.value.code == 2 and names_the_key(stderr.getvalue(), key), stderr.getvalue()
        if recorded_by_the_lock(key):
            assert "put back to" in stderr.getvalue(), stderr.getvalue()
            assert yaml.safe_load(params.read_text()) == default_params()
        else:
            assert "keeps the refused value" in stderr.getvalue(), stderr.getvalue()
            assert params.read_bytes() == written


@contextlib.contextmanager
def mock_environ(**values):
    """os.environ with `values` set for the block (a hypothesis test takes no monkeypatch)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize(
    ("override", "refused"),
    [
        ("train.max_steps=-1", False),  # no limit: train.max_epochs ends the run
        ("train.max_steps=-1.0", True),  # not the integer -1
        ("train.max_steps=true", True),  # YAML's true is no number
        ("train.lr_factor=inf", True),
        ("data.max_train_pairs=null", False),
        ("train.devices=[0,1]", False),
        ("train.devices=[0,-1]", True),
        ("model.d_model='512'", True),  # a string, not the integer
        ("train.lr_factor=3", False),  # an integer is a number
    ],
)
def test_a_domain_holds_type_range_and_specials(override, refused):
    try:
        config_lib.compose(["~experiment", "train.max_epochs=1", override])
    except config_lib.ConfigError as err:
        assert refused, err
        assert f"config key '{override.split('=')[0]}': must be " in str(err), err
    else:
        assert not refused


def test_a_value_set_on_a_validated_config_is_validated():
    """A sweep trial sets its paths and precision on the composed config: the value is held to
    its domain as it is set, by the same schema."""
    cfg = config_lib.compose([])
    cfg.train.precision = "bf16-mixed"
    cfg.paths.tokenized = "/tmp/tokenized"
    assert (cfg.train.precision, cfg.paths.tokenized) == ("bf16-mixed", "/tmp/tokenized")
    with pytest.raises(config_lib.ConfigError, match=r"^config key 'train.precision': .*'fp8'"):
        cfg.train.precision = "fp8"
    with pytest.raises(config_lib.ConfigError, match=r"^config key 'paths.prepared': "):
        cfg.paths.prepared = ""
    with pytest.raises(config_lib.ConfigError, match="model.heads"):
        cfg.model.heads = 3  # 128 / 3: the section's own check runs too


@functools.cache
def default_config():
    return config_lib.compose([])


@pytest.mark.parametrize(("key", "schema"), LEAVES, ids=[name for name, _ in LEAVES])
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(data=st.data())
def test_a_commands_value_over_a_section_is_held_to_the_keys_domain(key, schema, data):
    """What a command sets over a section (`translate --length-penalty`, the decoding search's
    grid: `config_schema.changed`): for every key, a value outside its domain is refused with
    the ConfigError naming the key, and the section it was asked of is left as it was; the
    key's own default is taken."""
    *sections, name = key.split(".")
    section = functools.reduce(getattr, sections, default_config())
    before = getattr(section, name)
    bad = data.draw(outside(schema), label=key)
    with pytest.raises(config_lib.ConfigError) as refused:
        changed(section, **{name: bad})
    assert names_the_key(str(refused.value), key), refused.value
    assert getattr(section, name) == before
    assert getattr(changed(section, **{name: before}), name) == before


def test_head_dim_frees_d_k_from_d_model_over_heads():
    """model.head_dim: absent or null, d_k = d_model / heads (heads must divide d_model); set,
    any positive d_k with any number of heads."""
    assert config_lib.compose([]).model.head_dim is None
    cfg = config_lib.compose(["model.d_model=128", "model.heads=3", "+model.head_dim=32"])
    assert (cfg.model.heads, cfg.model.head_dim) == (3, 32)
    with pytest.raises(config_lib.ConfigError, match="model.heads.*set model.head_dim"):
        config_lib.compose(["model.d_model=128", "model.heads=3"])
    with pytest.raises(config_lib.ConfigError, match="model.head_dim"):
        config_lib.compose(["+model.head_dim=0"])
