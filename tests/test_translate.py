"""`python -m pipeline.translate` as a user runs it: a subprocess, stdin in, stdout out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.config import to_dict
from tests.conftest import REPO_ROOT


def write_params(cfg, path: Path) -> Path:
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))), encoding="utf-8")
    return path


def run_translate(*args: str, stdin: str = "", cwd: Path = REPO_ROOT, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.translate", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def test_missing_checkpoint_names_the_path_and_the_fix(make_config, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    result = run_translate("--params", str(params), stdin="A dog runs.\n")
    expected = tmp_path / "eval" / "model.ckpt"
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: checkpoint {expected} not found")
    assert "dvc repro evaluate" in result.stderr and "dvc repro train" in result.stderr
    assert "--checkpoint" in result.stderr

    explicit = tmp_path / "elsewhere.ckpt"
    result = run_translate("--params", str(params), "--checkpoint", str(explicit))
    assert result.returncode == 2
    assert f"checkpoint {explicit} not found" in result.stderr


def test_missing_tokenizer_names_the_path_and_the_fix(make_config, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    checkpoint = tmp_path / "some.ckpt"
    checkpoint.write_bytes(b"not read: the tokenizer is checked first")
    result = run_translate("--params", str(params), "--checkpoint", str(checkpoint))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    expected = tmp_path / "data" / "tokenized" / "spm.model"
    assert result.stderr.startswith(f"error: tokenizer {expected} not found")
    assert "dvc repro tokenize" in result.stderr


def test_missing_params_file(tmp_path):
    result = run_translate("--params", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "absent.yaml not found" in result.stderr and "Traceback" not in result.stderr


def test_bad_beam_is_a_usage_error(tmp_path):
    result = run_translate("--beam", "0")
    assert result.returncode == 2
    assert "--beam: must be >= 1" in result.stderr
