"""Records name paths relative to the repository or to the work root: no tracked record holds
an absolute path of the machine it ran on (a home, a temporary folder, a checkout), and
`--relativize` rewrites one that does (text and Optuna's SQLite storage alike)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import optuna

from pipeline.portable_paths import (
    ATTRIBUTE_TABLES,
    DATABASE_SUFFIXES,
    absolute_paths,
    home_paths,
    relativize,
    tracked_records,
)
from tests.conftest import REPO_ROOT


def database_text(path) -> str:
    """Every attribute value of an Optuna SQLite storage, and its raw bytes (old pages too)."""
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        values = [value for table in ATTRIBUTE_TABLES if table in tables
                  for (value,) in db.execute(f"SELECT value_json FROM {table}")]  # fmt: skip
    return "\n".join(filter(None, values)) + path.read_bytes().decode("latin-1")


def test_no_tracked_record_holds_an_absolute_path():
    offenders = {}
    for path in tracked_records(REPO_ROOT):
        if path.name.endswith(DATABASE_SUFFIXES):
            text = database_text(path)
        else:
            text = path.read_text(encoding="utf-8")
        if found := absolute_paths(text):
            offenders[str(path.relative_to(REPO_ROOT))] = found[0]
    assert not offenders, (
        f"{len(offenders)} tracked record(s) hold absolute paths; rewrite them with "
        f"`python -m pipeline.portable_paths --relativize <files>`: {offenders}"
    )


def test_relativize_rewrites_a_study_run_elsewhere_and_any_other_absolute_path(tmp_path):
    """A study's records from a machine whose --work-dir and --results-dir were temporary
    folders: its points' and data folders are the work root's, its results folder the
    study's in the repository; a checkout's, a tool's or a temporary path, relative to the
    repository. A path after a mark, a URL, a ratio and a unit stay as they are."""
    trial = tmp_path / "ablations" / "results" / "s1" / "trials" / "base-seed1"
    trial.mkdir(parents=True)
    (trial / "params.yaml").write_text(
        "train_dir: /tmp/gpu/sweeps/s1/base-seed1/train\ntokenized: /tmp/gpu/sweeps/s1/data/tok\n"
        "wandb_dir: /tmp/gpu/results/s1/wandb\n"
    )
    parity = tmp_path / "results" / "parity.json"
    parity.parent.mkdir()
    kept = "<work-root>/s1/base-seed1 <run>/models/train https://example.org/a/b 1/2/3 tokens/s"
    parity.write_text(
        f'{{"command": "/opt/torch/bin/python3 -m x --out {tmp_path}/results/p.json '
        f'--work-dir /tmp/fairseq-work/s1", "kept": "{kept}"}}\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.portable_paths", "--relativize", "--repo", str(tmp_path),
         str(trial / "params.yaml"), str(parity)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (trial / "params.yaml").read_text() == (
        "train_dir: <work-root>/s1/base-seed1/train\ntokenized: <work-root>/s1/data/tok\n"
        "wandb_dir: ablations/results/s1/wandb\n"
    )
    python, work = (os.path.relpath(path, tmp_path.resolve())
                    for path in ("/opt/torch/bin/python3", "/tmp/fairseq-work/s1"))  # fmt: skip
    assert python.startswith("../") and work.startswith("../")
    assert parity.read_text() == (
        f'{{"command": "{python} -m x --out results/p.json --work-dir {work}", "kept": "{kept}"}}\n'
    )
    assert not absolute_paths(parity.read_text() + (trial / "params.yaml").read_text())


def test_relativize_rewrites_text_records_and_a_study_database(tmp_path):
    home = "/home/alice/.cache/transformer-ablations"
    record = tmp_path / "study" / "trials" / "base-seed1"
    record.mkdir(parents=True)
    (record / "params.yaml").write_text(f"paths:\n  train_dir: {home}/study/base-seed1/train\n")
    (record / "train.json").write_text(
        f'{{"checkpoint_dir": "{home}/study/base-seed1/train/checkpoints", '
        f'"resumed_from": "/root/runs/last.ckpt", "repo": "{REPO_ROOT}/models/train"}}\n'
    )
    storage = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    study = optuna.create_study(study_name="study", storage=storage)
    trial = study.ask()
    trial.set_user_attr("checkpoint_dir", f"{home}/study/base-seed1/train")
    study.tell(trial, 1.0)
    study.set_user_attr("note", "/root/notes")

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.portable_paths", "--relativize",
             str(tmp_path / "study")],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    result = run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("3 of 3 record(s) rewritten\n")
    assert (record / "params.yaml").read_text() == (
        "paths:\n  train_dir: <work-root>/study/base-seed1/train\n"
    )
    assert (record / "train.json").read_text() == (
        '{"checkpoint_dir": "<work-root>/study/base-seed1/train/checkpoints", '
        '"resumed_from": "~/runs/last.ckpt", "repo": "models/train"}\n'
    )
    study = optuna.load_study(study_name="study", storage=storage)
    assert study.trials[0].user_attrs["checkpoint_dir"] == "<work-root>/study/base-seed1/train"
    assert study.user_attrs["note"] == "~/notes" and study.trials[0].value == 1.0
    assert not home_paths(database_text(tmp_path / "study" / "study.db"))  # no old page either
    assert run().stdout.endswith("0 of 3 record(s) rewritten\n")  # idempotent


def test_relativize_leaves_other_absolute_paths_and_names_alone():
    text = "/tmp/x /work/shared/data /rooted/x a/root/b /home"
    assert relativize(text) == text
