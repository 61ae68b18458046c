"""W&B runs: offline files with the full config, the env/config mode rule, online->offline
fallback, and the reader for offline run files."""

from __future__ import annotations

import warnings

import pytest

from pipeline.config import to_dict
from pipeline.tracking import offline_run_dirs, read_offline_run, resolve_mode, start_wandb_run


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch):
    """No API key anywhere W&B looks (env, ~/.netrc, its settings dir)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)


def test_offline_run_holds_config_labels_and_history(make_config):
    cfg = make_config("experiment=smoke", "logger.wandb.tags=[smoke,unit]")
    run = start_wandb_run(cfg, job_type="train", name="unit-run")
    for step in range(1, 4):
        run.log({"train/loss": 1.0 / step, "trainer/global_step": step})
    run.summary["num_parameters"] = 1234
    run.finish()

    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    saved = read_offline_run(run_dir)
    assert saved["complete"]
    assert saved["config"] == to_dict(cfg)  # the full resolved config, nested
    assert saved["run"]["project"] == cfg.logger.wandb.project
    assert saved["run"]["job_type"] == "train"
    assert saved["run"]["group"] == "smoke"  # defaults to the experiment name
    assert saved["run"]["name"] == "unit-run"
    assert saved["run"]["tags"] == ["smoke", "unit"]
    losses = [row["train/loss"] for row in saved["history"] if "train/loss" in row]
    assert losses == pytest.approx([1.0, 0.5, 1 / 3])
    assert saved["summary"]["num_parameters"] == 1234


def test_environment_mode_wins_over_the_config(make_config, monkeypatch, no_wandb_account):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_config("logger.wandb.mode=online")
    assert resolve_mode("online") == "offline"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no online attempt, hence no fallback warning
        run = start_wandb_run(cfg, job_type="eval", group="g1")
    assert run.offline
    run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert read_offline_run(run_dir)["run"]["group"] == "g1"


def test_online_start_without_an_account_falls_back_to_offline(
    make_config, monkeypatch, no_wandb_account
):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = make_config("logger.wandb.mode=online", "logger.wandb.init_timeout=20")
    with pytest.warns(UserWarning, match="W&B online start failed .*logging offline"):
        run = start_wandb_run(cfg, job_type="train")
    assert run.offline
    run.log({"train/loss": 2.0})
    run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert read_offline_run(run_dir)["history"][0]["train/loss"] == 2.0


def test_disabled_mode_writes_no_run(make_config, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = make_config("logger.wandb.mode=disabled")
    run = start_wandb_run(cfg, job_type="train")
    run.log({"train/loss": 1.0})
    run.finish()
    assert offline_run_dirs(cfg.paths.wandb_dir) == []


def test_reader_rejects_other_files(tmp_path):
    (tmp_path / "run-x.wandb").write_bytes(b"not a wandb log")
    with pytest.raises(ValueError, match="not a W&B run file"):
        read_offline_run(tmp_path)
