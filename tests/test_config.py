"""pipeline.config: composition from conf/, params.yaml in sync, validation naming the key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pipeline import config as config_lib
from pipeline.errors import ConfigError
from tests.conftest import REPO_ROOT, run_stage, write_params


def test_params_yaml_is_the_composed_default():
    """params.yaml (what `dvc repro` reads) must equal conf/ composed with no overrides."""
    committed = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "params.yaml"))
    composed = OmegaConf.to_container(config_lib.compose_dict())
    assert committed == composed, "params.yaml is stale: run `make params`"


def test_every_conf_key_is_in_the_schema():
    """A key in conf/ that the dataclasses lack would only fail at run time; fail here."""
    for overrides in [
        [],
        ["experiment=smoke"],
        ["experiment=multi30k_tiny"],
        ["experiment=multi30k_base"],
    ]:
        cfg = config_lib.compose(overrides)
        assert isinstance(cfg, config_lib.Config)


def test_override_reaches_the_typed_config():
    cfg = config_lib.compose(["model.heads=8", "train.max_steps=7"])
    assert cfg.model.heads == 8 and cfg.train.max_steps == 7


def test_experiment_preset_selects_values():
    smoke = config_lib.compose(["experiment=smoke"])
    assert smoke.experiment_name == "smoke"
    assert smoke.data.max_train_pairs <= 2000
    assert smoke.train.max_steps <= 500 and smoke.model.d_model <= 128


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.heads=3", "model.heads"),
        ("model.dropout=1.5", "model.dropout"),
        ("model.positional=rotary", "model.positional"),
        ("train.label_smoothing=-0.1", "train.label_smoothing"),
        ("eval.nbest=9", "eval.nbest"),
        ("eval.bootstrap_samples=1", "eval.bootstrap_samples"),  # one resample: no interval
        ("train.cooldown_steps=9000", "train.cooldown_steps"),  # longer than max_steps
        ("train.cooldown_steps=-1", "train.cooldown_steps"),
        ("model.heads=abc", "model.heads"),
        ("+model.bogus=1", "model.bogus"),
        ("+train.max_tokns=10", "train.max_tokns"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_lib.compose([override])


@pytest.mark.parametrize(
    ("refused", "key", "allowed", "accepted"),
    [
        # 0 keeps no step-/best- checkpoint: training would finish, evaluate find none to average
        (["train.save_top_k=0"], "train.save_top_k", "must be -1 (keep every checkpoint) or >= 1",
         ["train.save_top_k=-1", "eval.average=10"]),  # Lightning's "keep all"
        (["train.save_top_k=-2"], "train.save_top_k", "must be -1 (keep every checkpoint) or >= 1",
         ["train.save_top_k=1", "eval.average=1"]),
        # evaluate would average fewer checkpoints than asked for (unless it takes one given)
        (["train.save_top_k=4", "eval.average=5"], "train.save_top_k", "set it to -1 or >= 5",
         ["train.save_top_k=1", "eval.average=5", "eval.checkpoint=model.ckpt"]),
        # at most floor(a * source length + b) tokens: empty or truncated hypotheses
        (["eval.max_len_b=-100"], "eval.max_len_b", "must be >= 0, got -100",
         ["eval.max_len_a=2", "eval.max_len_b=0"]),
        (["eval.max_len_a=-0.5"], "eval.max_len_a", "must be >= 0, got -0.5",
         ["eval.max_len_a=0", "eval.max_len_b=200"]),  # fairseq's default: a fixed limit
        (["eval.max_len_a=0", "eval.max_len_b=0"], "eval.max_len_b", "must be >= 1",
         ["eval.max_len_a=0", "eval.max_len_b=1"]),
    ],
)  # fmt: skip
def test_meaningless_checkpoint_and_length_limits_are_refused(refused, key, allowed, accepted):
    """Refused naming the key and the allowed range; the legitimate neighbour still passes."""
    with pytest.raises(ConfigError) as error:
        config_lib.compose(refused)
    assert str(error.value).startswith(f"config key '{key}': ")
    assert allowed in str(error.value)
    config_lib.compose(accepted)


@pytest.mark.parametrize(
    ("stage", "override", "key"),
    [
        # the train stage imports Lightning first: ~30 s on the loaded 2-core machine
        pytest.param("train", "train.save_top_k=0", "train.save_top_k", marks=pytest.mark.slow),
        ("evaluate", "eval.max_len_b=-100", "eval.max_len_b"),
    ],
)
def test_stage_cli_refuses_a_meaningless_value_before_any_compute(tmp_path, stage, override, key):
    """The stage reads params.yaml (composed, not validated, as `make params` writes it) and
    exits 2 with the key named, having written nothing: no data read, no model built."""
    write_params(tmp_path, "experiment=smoke", override)
    result = run_stage(stage, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: config key '{key}': must be ")
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_unknown_key_in_params_file_names_file_and_key(tmp_path):
    raw = OmegaConf.to_container(config_lib.compose_dict())
    raw["train"]["learning_rate"] = 1.0
    path = tmp_path / "params.yaml"
    OmegaConf.save(raw, path)
    with pytest.raises(ConfigError, match=r"params\.yaml.*train\.learning_rate"):
        config_lib.load(path)


def test_missing_params_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config_lib.load(tmp_path / "params.yaml")


def test_env_overrides_raw_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(config_lib.RAW_DIR_ENV, str(tmp_path))
    assert config_lib.compose().data.raw_dir == str(tmp_path)


def test_dict_round_trip():
    cfg = config_lib.compose(["experiment=smoke"])
    assert config_lib.from_dict(config_lib.to_dict(cfg)) == cfg
