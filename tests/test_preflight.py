"""The check stage's library: the corpus record follows the files' content, not their place,
and what a later stage would refuse is refused first."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline import preflight
from pipeline.config import RAW_DIR_ENV
from pipeline.errors import ConfigError, DataError
from tests.conftest import gzip_bomb, run_stage, write_params

CHECK_STAGE_TIMEOUT_S = 300


@pytest.fixture
def corpus_copy(tmp_path, multi30k_dir):
    """A second copy of the real corpus (what MULTI30K_DIR may point at)."""
    copy = tmp_path / "copy"
    shutil.copytree(multi30k_dir, copy)
    copy.chmod(0o755)
    return copy


def test_the_record_follows_the_content_not_the_folder(make_config, corpus_copy, multi30k_dir):
    original = preflight.check(make_config(f"data.raw_dir={multi30k_dir}"))
    assert preflight.check(make_config(f"data.raw_dir={corpus_copy}")) == original
    assert set(original["files"]) == {f"{s}.{lang}" for s in ("train", "val", "test_2016_flickr")
                                      for lang in ("en", "de")}  # fmt: skip

    val = corpus_copy / "val.de.gz"
    val.chmod(0o644)
    with gzip.open(val, "rt", encoding="utf-8") as handle:
        lines = handle.readlines()[:500]
    with gzip.open(val, "wt", encoding="utf-8") as handle:
        handle.writelines(lines)
    changed = preflight.check(make_config(f"data.raw_dir={corpus_copy}"))
    assert changed["files"]["val.de"] != original["files"]["val.de"]
    assert {k: v for k, v in changed["files"].items() if k != "val.de"} == {
        k: v for k, v in original["files"].items() if k != "val.de"
    }


def test_a_missing_split_is_refused_naming_its_files(make_config):
    cfg = make_config("data.test_splits=[test_2016_flickr,test_2099]", "data.download=false")
    with pytest.raises(DataError, match=r"test_2099\.en, test_2099\.de"):
        preflight.check(cfg)


def test_a_missing_checkpoint_is_refused_naming_the_key(make_config, tmp_path):
    cfg = make_config(f"eval.checkpoint={tmp_path / 'nope.ckpt'}")
    with pytest.raises(ConfigError, match=r"config key 'eval.checkpoint': .*nope\.ckpt"):
        preflight.check(cfg)


def test_text_files_are_recorded_and_checked(make_config, multi30k_dir):
    cfg = make_config("data.source=text")
    with pytest.raises(ConfigError, match="data.text_files"):
        preflight.check(cfg)
    cfg.data.text_files = {
        split: {side: str(multi30k_dir / f"{split}.{lang}.gz")
                for side, lang in (("src", "en"), ("tgt", "de"))}
        for split in ("train", "val", "test_2016_flickr")
    }  # fmt: skip
    record = preflight.check(cfg)
    assert record["files"]["val.tgt"] == preflight.check(make_config())["files"]["val.de"]
    cfg.data.text_files["val"]["src"] = str(multi30k_dir / "nope.en")
    with pytest.raises(DataError, match=r"nope\.en"):
        preflight.check(cfg)


def test_the_check_stage_notes_a_run_too_short_for_its_averaging(tmp_path, multi30k_dir):
    """`dvc exp run -S train.max_steps=40` on the smoke preset (a validation every 100 steps,
    eval.average=2): the check stage says, before training, that one checkpoint will be
    averaged; at the preset's own length it says nothing."""
    env = {**os.environ, RAW_DIR_ENV: str(multi30k_dir)}
    write_params(tmp_path, "experiment=smoke", "train.max_steps=40", "data.download=false")
    short = run_stage("check", tmp_path, env)
    assert short.returncode == 0, short.stderr
    assert "note: eval.average=2, but this run saves 1 step checkpoint(s)" in short.stdout
    write_params(tmp_path, "experiment=smoke", "data.download=false")
    preset = run_stage("check", tmp_path, env)
    assert preset.returncode == 0 and "eval.average" not in preset.stdout, preset.stderr


def _check_stage(folder: Path, corpus: Path) -> tuple[int, str, int]:
    """`python -m pipeline.stages.check` on `corpus`: exit code, stderr, peak memory in bytes."""
    process = subprocess.Popen([sys.executable, "-m", "pipeline.stages.check"], cwd=folder,
                               env={**os.environ, RAW_DIR_ENV: str(corpus)},
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
    deadline = threading.Timer(CHECK_STAGE_TIMEOUT_S, process.kill)  # wait4 has no timeout
    deadline.start()
    try:
        stderr = process.stderr.read().decode()
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        deadline.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode != -signal.SIGKILL, f"no end within {CHECK_STAGE_TIMEOUT_S} s"
    return process.returncode, stderr, usage.ru_maxrss * 1024


def test_the_check_stage_refuses_a_gzip_bomb_in_bounded_memory(tmp_path, corpus_copy):
    """A train.en.gz under 1 MB holding 96 MiB of text, past the 64 MiB bound in conf/: exit 2 naming
    the file, before prepare (which DVC would run next, deleting its outputs) and without
    decompressing it whole."""
    write_params(tmp_path, "data.download=false")
    code, stderr, normal = _check_stage(tmp_path, corpus_copy)
    assert code == 0, stderr
    bomb = corpus_copy / "train.en.gz"
    bomb.chmod(0o644)
    gzip_bomb(bomb, 96, b"two dogs are playing in the snow .\n")
    assert bomb.stat().st_size < 1_000_000
    code, stderr, peak = _check_stage(tmp_path, corpus_copy)
    assert code == 2, stderr
    assert (
        stderr.startswith(f"error: {bomb}: more than 64 MiB of text") and "Traceback" not in stderr
    )
    assert peak < normal + (32 << 20), (peak, normal)  # the bomb's 96 MiB never were in memory
