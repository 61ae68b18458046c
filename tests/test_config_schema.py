"""pipeline.config_schema: every key has a domain (type, range, choices), and the check stage
refuses any value outside it, naming the key, before anything is written."""

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
from pipeline import config_schema
from pipeline.cli import main
from pipeline.stages import check
from tests.conftest import outside_domain, set_key

LEAVES = config_schema.schema_leaves(config_schema.Config)


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
    """A key added without a domain fails here: the check stage could not hold it to one."""
    assert len(LEAVES) > 100
    assert [name for name, _, domain in LEAVES if domain is None] == []


def test_the_default_and_every_preset_are_inside_every_domain():
    for experiment in ("smoke", "multi30k_tiny", "multi30k_base", "multi30k_wu2021"):
        config_lib.compose([f"experiment={experiment}"])
    config_lib.compose([])


@pytest.mark.parametrize(("key", "hint", "domain"), LEAVES, ids=[name for name, *_ in LEAVES])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_value_outside_its_domain_is_refused_by_the_check_stage_naming_the_key(
    key, hint, domain, data
):
    """For every key of the schema, a value outside its domain (of the wrong type, below its
    minimum, above its maximum, not a choice, ...) in params.yaml: the check stage's entry point
    exits 2 naming the key, without a traceback, and writes nothing. Under `dvc exp run` (which
    wrote the value there) it puts the key back as the last run recorded it in dvc.lock, or
    says that params.yaml keeps the value where no run recorded the key."""
    bad = data.draw(outside_domain(hint, domain), label=key)
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
    ("value", "hint", "domain", "refused"),
    [
        (-1, int, config_schema.Domain(ge=1, also={-1: "all"}), False),
        (-1.0, int, config_schema.Domain(ge=1, also={-1: "all"}), True),  # not the integer -1
        (True, int, config_schema.Domain(), True),  # YAML's true is no number
        (float("inf"), float, config_schema.Domain(), True),
        (None, config_schema.Optional[int], config_schema.Domain(ge=1), False),
        (
            [0, 1],
            config_schema.Any,
            config_schema.Domain(choices=("auto",), items=config_schema.Domain(ge=0)),
            False,
        ),  # fmt: skip
        (
            {"x": "y"},
            dict[str, str],
            config_schema.Domain(keys=config_schema.Domain(choices=("x",))),
            False,
        ),  # fmt: skip
    ],
)
def test_a_domain_holds_type_range_and_specials(value, hint, domain, refused):
    assert (config_schema.domain_problem(value, hint, domain) is not None) == refused
