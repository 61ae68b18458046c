"""pipeline.sweep.spec: every key of a study spec has a domain, and the sweep command refuses a
value outside it, naming the file and key, before any storage is opened or anything written."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import sweep
from pipeline.cli import main
from pipeline.config_reference import leaves
from pipeline.sweep.cli import cli, parse_args, worker_flags
from pipeline.sweep.spec_schema import json_schema
from tests.conftest import GRID_SPEC, REPO_ROOT, set_key
from tests.schema_values import accepts, outside

LEAVES = leaves(root=json_schema())  # (dotted key, its JSON Schema), the settings' too

SPEC = GRID_SPEC  # each test changes one key of it
# variants to contrast and estimate: the base and two others
PAIRED = {"variants": {"base": {}, "a": {"model.dropout": 0.0}, "b": {"model.dropout": 0.2}}}


def names_the_key(stderr: str, key: str) -> bool:
    """`error: <spec>: key '<key>'...`: the key itself, or a part of it (an item, an entry)."""
    return re.search(rf"key '{re.escape(key)}[.\['[]", stderr) is not None


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def sweep_command(spec: Path, root: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m pipeline.sweep spec` with its results and work folders under `root`."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), *flags,
         "--results-dir", str(root / "results"), "--work-dir", str(root / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def refused(spec: Path, root: Path, *flags: str) -> str:
    """The sweep command's entry point in this process (`main(cli)`, as the console script
    runs it): asserts exit 2, returns what it printed on stderr."""
    stderr = io.StringIO()
    args = [str(spec), *flags, "--results-dir", str(root / "results"), "--work-dir",
            str(root / "work")]  # fmt: skip
    with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(stderr):
        main(lambda: cli(args))
    assert exit.value.code == 2, stderr.getvalue()
    return stderr.getvalue()


def test_every_key_of_a_spec_has_a_domain():
    """A spec key or setting added without a domain fails here: one of any value, free text, a
    number without a lower bound, or one declared without its meaning (`key(default,
    meaning)`)."""
    names = [name for name, _ in LEAVES]
    assert {"seeds", "n_trials", "objective.metric", "settings.trial_minutes_estimate",
            "settings.max_grid_points"} <= set(names)  # fmt: skip
    anything = ("a b", 1.5, -1, True, [1], {"a": 1})
    assert [name for name, schema in LEAVES if all(accepts(schema, v) for v in anything)] == []
    assert [name for name, schema in LEAVES if accepts(schema, "") and accepts(schema, "a b")] == []
    assert [name for name, schema in LEAVES if accepts(schema, -(10**12))] == []
    assert [name for name, schema in LEAVES if not schema.get("description")] == []


@pytest.mark.slow  # every variant of every study composed: minutes on a loaded 2-core machine
def test_every_spec_in_the_repository_loads():
    specs = sorted((REPO_ROOT / "ablations").glob("*.yaml"))
    assert len(specs) >= 7
    for path in [*specs, *sorted((REPO_ROOT / "benchmarks" / "specs").glob("*.yaml"))]:
        assert sweep.load_spec(path).study == path.stem


@pytest.mark.parametrize(("key", "schema"), LEAVES, ids=[name for name, _ in LEAVES])
@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(data=st.data())
def test_a_value_outside_its_domain_is_refused_by_the_sweep_naming_the_key(key, schema, data):
    """For every key of a spec (its settings too), a value outside its domain: the sweep
    command exits 2 naming the spec and the key, without a traceback, and writes nothing (no
    storage, no folder)."""
    bad = data.draw(outside(schema), label=key)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        spec = root / "spec.yaml"
        spec.write_text(yaml.safe_dump(set_key(SPEC, key, bad)))
        before = files_under(root)
        stderr = refused(spec, root)
        assert stderr.startswith(f"error: {spec}: ") and names_the_key(stderr, key), stderr
        assert files_under(root) == before and sorted(root.iterdir()) == [spec]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # each of these ended in a traceback, ran nothing, or wrote the storage first
        ({"seeds": []}, "key 'seeds': must be a list of at least one item"),
        ({"seeds": [-1, 2]}, "key 'seeds': item 0: must be in [0, 4294967296)"),
        ({"settings": {"foo": 1}}, "unknown key(s) ['settings.foo']"),
        ({"objective": "val/bleu"}, "key 'objective': must be a mapping"),
        ({"objective": {"metric": "val/bleu"}}, "missing key 'objective.direction'"),
        ({"objective": {"metric": "val/blue", "direction": "maximize"}},
         "key 'objective.metric': must be one of"),
        ({"variants": {"x" * 300: {}}}, f"key 'variants.{'x' * 300}': "),
        ({"variants": {"a\nb": {}}}, "key 'variants.a\nb': 'a\\nb' is not a folder name"),
        ({"seeds": list(range(2000))}, "key 'settings.max_grid_points': the grid holds 2000"),
        ({"settings": {"heartbeat_interval": -1}}, "key 'settings.heartbeat_interval': must be"),
        ({"kind": "search", "n_trials": -1, "space": {"model.dropout": {
            "type": "float", "low": 0.0, "high": 0.5}}}, "key 'n_trials': must be null or >= 1"),
        ({"kind": "search", "n_trials": 2, "space": {"model.dropout": {
            "type": "float", "low": 0.5, "high": 0.1}}}, "key 'space.model.dropout': needs low"),
        ({"pruner": {"type": "median", "n_startup_trails": 4}}, "key 'pruner': median pruner"),
        ({"base_experiment": "tiny"}, "key 'base_experiment': no experiment 'tiny'"),
        ({**PAIRED, "contrasts": [["a", "c"]]}, "key 'contrasts[0]': ['c'] not among the variants"),
        ({**PAIRED, "contrasts": [["a", "a"]]}, "key 'contrasts[0]': ['a', 'a'] must name two"),
        ({**PAIRED, "contrasts": [["a", "base"]]}, "key 'contrasts[0]': ['a', 'base'] must name"),
        ({**PAIRED, "contrasts": [["a", "b"], ["b", "a"]]},
         "key 'contrasts[1]': ['b', 'a'] is listed twice"),
        ({**PAIRED, "contrasts": [["a"]]}, "key 'contrasts': item 0: must be a list of 2 items"),
        ({**PAIRED, "trial_hours": {"c": 1.0}}, "key 'trial_hours.c': no such variant"),
        ({**PAIRED, "trial_hours": {"a": 0}}, "key 'trial_hours': entry 'a': must be > 0"),
        # an objective a variant's training never returns: every trial would fail at its end
        ({"budget": {"train.val_bleu": False}},
         "key 'objective.metric': val/greedy_bleu is training's greedy validation BLEU, which "
         "variant 'base' does not decode"),
        ({"kind": "search", "n_trials": 2, "variants": {}, "budget": {"train.val_bleu": False},
          "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.5}}},
         "key 'objective.metric': val/greedy_bleu"),
    ],
)  # fmt: skip
def test_the_sweep_refuses_a_bad_spec_before_it_opens_a_storage(tmp_path, change, named):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, **change}))
    stderr = refused(spec, tmp_path)
    assert stderr.startswith(f"error: {spec}: ") and named in stderr, stderr
    assert sorted(tmp_path.iterdir()) == [spec]


def test_the_sweep_command_refuses_a_bad_setting_at_once_without_a_traceback(tmp_path):
    """`python -m pipeline.sweep` itself: `heartbeat_interval: -1` is refused naming the key,
    not after the storage's retries, and no storage is written."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "settings": {"heartbeat_interval": -1}}))
    result = sweep_command(spec, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: {spec}: key 'settings.heartbeat_interval': must be")
    assert "Traceback" not in result.stderr and "storage" not in result.stderr
    assert sorted(tmp_path.iterdir()) == [spec]


def test_a_grid_larger_than_its_bound_runs_only_with_allow_large_grid(tmp_path):
    """Over `settings.max_grid_points`, the sweep refuses unless told --allow-large-grid; then
    every point is enqueued, and a launcher passes the flag on to its workers."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump({**SPEC, "seeds": [1, 2, 3], "settings": {"max_grid_points": 2}})
    )
    assert "--allow-large-grid" in refused(spec, tmp_path, "--n-trials", "0")
    assert sorted(tmp_path.iterdir()) == [spec]
    main(lambda: cli([str(spec), "--n-trials", "0", "--allow-large-grid", "--results-dir",
                      str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")]))  # fmt: skip
    storage = f"sqlite:///{tmp_path / 'results' / 'domains' / 'study.db'}"
    study = optuna.load_study(study_name="domains", storage=storage)
    assert len(study.trials) == 3
    args = parse_args([str(spec), "--allow-large-grid", "--workers", "2"])
    assert "--allow-large-grid" in worker_flags(args, None)


def test_a_grid_too_large_is_counted_before_its_lists_are_built(tmp_path):
    """The points are counted from the spec's YAML before a list is built or an item
    checked: the seeds of a grid over the bound end in an item SafeLoader cannot build, and the
    refusal is still the grid's size (building the list first, a spec of 10**6 seeds took over
    a minute to refuse); within the bound, the same item is the error it is."""
    spec = tmp_path / "spec.yaml"
    text = yaml.safe_dump({key: value for key, value in SPEC.items() if key != "seeds"})

    def write(seeds: int) -> None:
        items = "".join(f"- {seed}\n" for seed in range(1, seeds))
        spec.write_text(f"{text}seeds:\n{items}- !!python/name:os.system ''\n")

    write(5000)
    message = refused(spec, tmp_path, "--n-trials", "0")
    assert (
        "key 'settings.max_grid_points': the grid holds 5000 points (1 variants x 5000" in message
    )
    write(3)
    assert "is not a readable YAML file" in refused(spec, tmp_path, "--n-trials", "0")
    assert sorted(tmp_path.iterdir()) == [spec]


def test_a_negative_trial_count_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    with pytest.raises(SystemExit) as exit:
        parse_args([str(spec), "--n-trials", "-1"])
    assert exit.value.code == 2 and "--n-trials must be >= 0" in capsys.readouterr().err


def test_planned_hours_add_up_every_point_once_each_variant_has_an_estimate(tmp_path):
    from pipeline.sweep.spec import planned_hours

    path = tmp_path / "spec.yaml"
    hours = {"base": 1.0, "a": 0.5, "b": 2.0}
    path.write_text(yaml.safe_dump({**SPEC, **PAIRED, "seeds": [1, 2], "contrasts": [["a", "b"]],
                                    "trial_hours": hours}))  # fmt: skip
    spec = sweep.load_spec(path)
    assert spec.contrasts == [["a", "b"]]
    assert planned_hours(spec) == 2 * 3.5
    path.write_text(yaml.safe_dump({**SPEC, **PAIRED, "trial_hours": {"a": 0.5}}))
    assert planned_hours(sweep.load_spec(path)) is None


def test_a_variant_sets_a_key_that_conf_leaves_out_and_a_misspelt_one_is_refused(tmp_path):
    """`model.head_dim` (null by default, so absent from conf/) is set like any other key."""
    from pipeline.sweep.spec import point_config

    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump({**SPEC, "variants": {"base": {}, "dk_8": {"model.head_dim": 8}}})
    )
    spec = sweep.load_spec(path)
    assert point_config(spec, spec.variants["dk_8"]).model.head_dim == 8
    assert point_config(spec, {}).model.head_dim is None
    path.write_text(yaml.safe_dump({**SPEC, "variants": {"base": {}, "x": {"model.hed_dim": 8}}}))
    stderr = refused(path, tmp_path)
    assert "variant 'x'" in stderr and "'model.hed_dim'" in stderr, stderr
