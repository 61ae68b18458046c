"""Whether a run continues a checkpoint: configs that compute the same run resume, others are
refused (an interrupted run) or moved aside (a finished one); a run stopped under `dvc exp run`
is kept from the next checkout and put back."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from pipeline import config as config_lib
from pipeline.errors import ConfigError
from pipeline.training.checkpoint_io import AtomicCheckpointIO
from pipeline.training.checkpoints import (
    LAST_NAME,
    SOURCE_HASH_KEY,
    checkpoint_dir,
    read_checkpoint,
    source_hash,
)
from pipeline.training.resume import (
    check_resumable,
    check_same_run,
    config_differences,
    restore_preempted_run,
    resume_checkpoint,
    stash_preempted_run,
)


def test_resume_refuses_a_checkpoint_of_another_model(make_config, tmp_path):
    trained = make_config("model.heads=4")
    path = tmp_path / LAST_NAME
    checkpoint = {"state_dict": {}, "global_step": 10,
                  "hyper_parameters": {"config": config_lib.to_dict(trained), "vocab_size": 9}}  # fmt: skip
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    with pytest.warns(UserWarning, match="'train.max_steps' is 99999"):  # longer: fine
        check_resumable(path, make_config("model.heads=4", "train.max_steps=99999"))
    with pytest.raises(ConfigError, match=r"'model.heads' is 2 \(the checkpoint's: 4\)"):
        check_resumable(path, make_config("model.heads=2"))


def _fake_run(cfg, global_step: int, code: str | None = None) -> Path:
    """A checkpoint of `cfg` at `global_step` in its train_dir, as training leaves it."""
    path = checkpoint_dir(cfg.paths.train_dir) / LAST_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"state_dict": {}, "global_step": global_step,
                  "hyper_parameters": {"config": config_lib.to_dict(cfg), "vocab_size": 9},
                  SOURCE_HASH_KEY: code or source_hash()}  # fmt: skip
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    return path


@pytest.mark.parametrize(
    ("trained_step", "overrides", "code", "expected"),
    [
        (5, [], None, "resume"),  # interrupted: continue
        (10, ["train.max_steps=20"], None, "resume"),  # finished, asked for more: extend
        (10, [], None, "resume"),  # finished, same config and code: done, nothing retrained
        (10, [], "older-code", "anew"),  # finished, code changed (dvc repro): train anew
        (10, ["model.heads=2"], None, "anew"),  # finished, another experiment: train anew
        (10, ["train.lr_factor=3.0"], None, "anew"),
        (10, ["train.max_steps=8"], None, "anew"),  # finished, a shorter run asked for
        (5, ["model.heads=2"], None, "error"),  # interrupted, another model: keep it, say so
        (5, ["train.lr_factor=3.0"], None, "error"),  # interrupted, another schedule
        (5, ["train.warmup_steps=7"], None, "error"),
        (5, ["train.label_smoothing=0.2"], None, "error"),
        (5, ["train.max_steps=4"], None, "error"),  # below the progress made
        (5, ["train.val_check_interval=3", "train.log_every_n_steps=1"], None, "resume"),
    ],
)
def test_resume_decision(make_config, tmp_path, trained_step, overrides, code, expected):
    trained = make_config("model.heads=4", "train.max_steps=10")
    path = _fake_run(trained, trained_step, code)
    current = make_config("model.heads=4", "train.max_steps=10", *overrides)
    if expected == "error":
        key = overrides[0].split("=")[0]
        with pytest.raises(ConfigError, match=f"'?{key}'?[ =]"):
            resume_checkpoint(current)
        assert path.exists()
    elif expected == "resume":
        assert resume_checkpoint(current) == path
    else:
        with pytest.warns(UserWarning, match="training anew .* moved the previous run's"):
            assert resume_checkpoint(current) is None
        assert not path.exists()
        aside = list(Path(f"{trained.paths.train_dir}.replaced").glob(f"*/{LAST_NAME}"))
        assert len(aside) == 1 and read_checkpoint(aside[0])["global_step"] == trained_step


def test_a_run_stopped_under_dvc_exp_run_is_kept_from_the_checkout_and_resumed(
    make_config, tmp_path
):
    """The next `dvc exp run` checks the workspace out first: it deletes a train output DVC
    never recorded, or puts back the one it did (here another experiment's finished run)."""
    stopped = make_config("model.heads=4", "train.max_steps=10")
    _fake_run(stopped, 5)
    kept = checkpoint_dir(f"{stopped.paths.train_dir}.preempted")
    assert stash_preempted_run(stopped) == kept and (kept / LAST_NAME).exists()
    assert not list(checkpoint_dir(stopped.paths.train_dir).glob("*.ckpt"))
    _fake_run(make_config("model.heads=2", "train.max_steps=10"), 10)  # the checkout's
    with pytest.warns(UserWarning) as caught:
        path = resume_checkpoint(stopped)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"resuming the stopped run from {kept}: the run found there is")
    assert "training anew" not in message
    assert read_checkpoint(path)["global_step"] == 5 and not list(kept.iterdir())
    aside = list(Path(f"{stopped.paths.train_dir}.replaced").glob(f"*/{LAST_NAME}"))
    assert len(aside) == 1 and read_checkpoint(aside[0])["global_step"] == 10
    restore_preempted_run(stopped)  # nothing kept any more: nothing moves
    assert read_checkpoint(path)["global_step"] == 5
    assert stash_preempted_run(make_config(root=tmp_path / "fresh")) is None  # nothing to keep


def test_resume_lists_the_free_keys_that_differ(make_config):
    trained = make_config("model.heads=4", "train.max_steps=10")
    _fake_run(trained, 5)
    current = make_config("model.heads=4", "train.max_steps=20", "train.val_check_interval=3")
    with pytest.warns(UserWarning, match="'train.max_steps' is 20 .*'train.val_check_interval'"):
        resume_checkpoint(current)
    with_cooldown = make_config("model.heads=4", "train.max_steps=10", "train.cooldown_steps=4")
    _fake_run(with_cooldown, 5)
    longer = make_config("model.heads=4", "train.max_steps=20", "train.cooldown_steps=4")
    with pytest.raises(ConfigError, match="'train.max_steps'"):  # the cool-down starts from it
        resume_checkpoint(longer)


def test_a_checkpoint_older_than_a_config_key_resumes_as_its_default(make_config):
    """Keys added since a checkpoint was written default to what ran before them: the run
    resumes (a study's interrupted trial after a code update); another value is refused."""
    cfg = make_config()
    saved = config_lib.to_dict(cfg)
    del saved["runtime"]["cpu_speed_paths"], saved["train"]["float32_matmul_precision"]
    fixed, _ = config_differences(saved, cfg)
    assert fixed == []
    cfg.runtime.cpu_speed_paths = False  # not what the older code ran
    fixed, _ = config_differences(saved, cfg)
    assert fixed == ["runtime.cpu_speed_paths"]


def test_a_path_the_checkpoint_wrote_portably_is_the_same_value(make_config, tmp_path, monkeypatch):
    """A checkpoint writes the paths of its config relative to the working folder: resuming with
    the same file named by its absolute path is the same run; another file is not."""
    from pipeline.training.checkpoints import portable_checkpoint

    monkeypatch.chdir(tmp_path)
    cfg = make_config("data.source=text")
    cfg.data.text_files = {"train": {"src": str(tmp_path / "corpus" / "train.en")}}
    saved = portable_checkpoint({"hyper_parameters": {"config": config_lib.to_dict(cfg)}})
    assert saved["hyper_parameters"]["config"]["data"]["text_files"]["train"]["src"] == (
        "corpus/train.en"
    )
    assert config_differences(saved["hyper_parameters"]["config"], cfg)[0] == []
    cfg.data.text_files = {"train": {"src": str(tmp_path / "other" / "train.en")}}
    assert config_differences(saved["hyper_parameters"]["config"], cfg)[0] == [
        "data.text_files.train.src"
    ]


def test_a_checkpoint_with_host_knobs_under_train_resumes(make_config, tmp_path):
    """A checkpoint saved before `runtime` had its own section holds the host knobs under
    `train.`: the same run resumes without a warning, a knob that changes the run
    (cpu_speed_paths) is still refused, and one that cannot (compile_loss) is only listed."""
    cfg = make_config()
    saved = config_lib.to_dict(cfg)
    saved["train"].update(saved.pop("runtime"))  # the older layout
    checkpoint = tmp_path / "last.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_same_run(checkpoint, cfg, "refused", saved) == []
    cfg.runtime.compile_loss = not cfg.runtime.compile_loss
    free = check_same_run(checkpoint, cfg, "refused", saved)
    assert len(free) == 1 and free[0].startswith("'runtime.compile_loss'")
    cfg.runtime.cpu_speed_paths = not cfg.runtime.cpu_speed_paths
    with pytest.raises(ConfigError, match="'runtime.cpu_speed_paths' differs"):
        check_same_run(checkpoint, cfg, "refused", saved)


def test_a_run_checked_out_again_and_again_is_kept_once_and_described(make_config):
    """`dvc exp run -S ...` puts the last recorded run back from DVC's cache before each
    experiment, which then moves it aside again: one copy per distinct run is kept, with a
    record `pipeline.clean` shows; another run gets a folder of its own."""
    from pipeline.clean import train_leftovers

    finished = make_config("model.heads=4", "train.max_steps=10")
    path = _fake_run(finished, 10)
    original = path.read_bytes()
    replaced = Path(f"{finished.paths.train_dir}.replaced")
    for heads in (2, 1, 8):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(original)  # the checkout
        with pytest.warns(UserWarning, match="training anew") as caught:
            assert (
                resume_checkpoint(make_config(f"model.heads={heads}", "train.max_steps=10")) is None
            )
        assert not path.exists()
    (kept,) = replaced.iterdir()
    assert (kept / LAST_NAME).read_bytes() == original
    assert f"is already kept in {kept}" in str(caught[0].message)
    record = json.loads((kept / "replaced.json").read_text())
    assert record["step"] == 10 and "model.heads" in record["why"]

    _fake_run(make_config("model.heads=2", "train.max_steps=10"), 10)  # another run
    with pytest.warns(UserWarning, match="moved the previous run's"):
        resume_checkpoint(make_config("model.heads=1", "train.max_steps=10"))
    assert len(list(replaced.iterdir())) == 2
    (listed, _) = train_leftovers(Path(finished.paths.train_dir))
    assert listed.path == kept
    assert listed.why == f"a run at step 10 replaced by a newer one ({record['why']})"
