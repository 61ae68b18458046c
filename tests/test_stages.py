"""dvc.yaml against the code it runs: every module a stage imports is one of its dependencies
(its folder or the file), and only the summary is declared as DVC metrics."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest
import ruamel.yaml
import yaml

from pipeline.config import leaves, subtree
from tests.conftest import REPO_ROOT

PIPELINE = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def _resolve(path: str) -> str:
    """`${paths.x}` of dvc.yaml, read from params.yaml as DVC does."""
    if path.startswith("${paths."):
        key, rest = path[len("${paths.") :].split("}", 1)
        return PARAMS["paths"][key] + rest
    return path


def _module_file(name: str) -> Path | None:
    base = REPO_ROOT / Path(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported_files(module: str) -> set[str]:
    """The repository files `module` runs: every `pipeline` module it imports, at the top or
    inside a function, and theirs in turn (with their packages' __init__ files)."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return {
        path.relative_to(REPO_ROOT).as_posix()
        for path in seen
        if path.stat().st_size > 0  # an empty __init__ runs nothing (DVC warns on empty deps)
    }


@pytest.mark.parametrize("stage", sorted(PIPELINE["stages"]))
def test_code_dependencies_cover_every_imported_module(stage):
    definition = PIPELINE["stages"][stage]
    module = definition["cmd"].split("python -m ", 1)[1].split()[0]
    deps = [_resolve(dep) for dep in definition["deps"]]
    missing = [dep for dep in deps if dep.startswith("pipeline") and not (REPO_ROOT / dep).exists()]
    assert not missing, f"stage {stage}: dependencies that do not exist: {missing}"
    uncovered = sorted(
        path
        for path in imported_files(module)
        if not any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)
    )
    assert not uncovered, f"stage {stage} imports {uncovered}, which dvc.yaml does not list"


def test_only_the_summary_is_a_dvc_metric():
    metrics = [
        _resolve(next(iter(entry)) if isinstance(entry, dict) else entry)
        for definition in PIPELINE["stages"].values()
        for entry in definition.get("metrics", [])
    ]
    assert metrics == ["metrics/summary.json"]


def test_check_stage_comes_first_and_always_runs():
    check = PIPELINE["stages"]["check"]
    assert check["always_changed"] is True
    record = _resolve(next(iter(check["outs"][0])))
    assert record in [_resolve(dep) for dep in PIPELINE["stages"]["prepare"]["deps"]]


def test_the_committed_summary_is_what_summarize_makes_of_the_committed_run(tmp_path):
    """metrics/summary.json holds the names the current code gives (what `dvc exp show` lines
    up against new experiments): it is `summarize` of the run record under results/ whose
    train.json and eval.json are the ones dvc.lock says the summarize stage read."""
    import dataclasses
    import json

    from pipeline import config, summary

    lock = ruamel.yaml.YAML(typ="safe").load((REPO_ROOT / "dvc.lock").read_text())["stages"]
    read = {Path(dep["path"]).name: dep["md5"] for dep in lock["summarize"]["deps"]}
    records = [
        folder
        for folder in sorted((REPO_ROOT / "results").iterdir())
        if all(
            (folder / name).is_file()
            and hashlib.md5((folder / name).read_bytes()).hexdigest() == read[name]
            for name in ("train.json", "eval.json")
        )
    ]
    assert len(records) == 1, records
    for name in ("train.json", "eval.json"):
        (tmp_path / name).write_bytes((records[0] / name).read_bytes())
    cfg = config.load(REPO_ROOT / "params.yaml")
    cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, metrics_dir=str(tmp_path)))
    committed = json.loads((REPO_ROOT / "metrics" / summary.SUMMARY_FILE).read_text())
    assert committed == summary.summarize(cfg)
    assert "test/bleu_lc" in committed and "train/steps" in committed


def test_the_committed_run_record_is_one_run_of_the_committed_params():
    """dvc.lock, metrics/summary.json and data/corpus.json are committed together from one
    `dvc repro` of the default experiment: the two files are the outputs the lock recorded, and
    every parameter the lock says the run used is what params.yaml holds (a changed default
    needs a new run before its result is committed)."""
    # DVC writes YAML 1.2, where `1e-09` is a number (PyYAML's YAML 1.1 reads it as text)
    lock = ruamel.yaml.YAML(typ="safe").load((REPO_ROOT / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(PIPELINE["stages"])
    recorded = {out["path"]: out["md5"] for stage in lock.values() for out in stage["outs"]}
    for committed in ("metrics/summary.json", PARAMS["paths"]["corpus_record"]):
        md5 = hashlib.md5((REPO_ROOT / committed).read_bytes()).hexdigest()
        assert recorded[committed] == md5, committed
    differing = [
        key
        for stage in lock.values()
        for section, value in stage.get("params", {}).get("params.yaml", {}).items()
        for key, used in leaves(value, section).items()
        if used != subtree(PARAMS, key)
    ]
    assert differing == []
