"""Checkpoints: crash-safe writes (a kill, a full disk), resume discovery, selection for
averaging, averaging."""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from pipeline.atomic import atomic_write
from pipeline.config import to_dict
from pipeline.errors import DataError, DiskFullError
from pipeline.training.checkpoint_io import AtomicCheckpointIO
from pipeline.training.checkpoints import (
    CORRUPT_SUFFIX,
    LAST_NAME,
    PROGRESS_NAME,
    average_checkpoints,
    checkpoint_dir,
    find_resume_checkpoint,
    move_checkpoints,
    read_checkpoint,
    select_checkpoints,
)
from pipeline.training.resume import resume_checkpoint
from tests.conftest import shared_root


def _checkpoint(step: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "global_step": step,
        "hyper_parameters": {"vocab_size": 7},
        "state_dict": {
            "model.weight": torch.randn(4, 3, generator=generator),
            "model.half": torch.randn(5, generator=generator).to(torch.bfloat16),
            "model.counter": torch.tensor([step], dtype=torch.long),
        },
    }


def _save(path, step: int, seed: int = 0) -> None:
    AtomicCheckpointIO().save_checkpoint(_checkpoint(step, seed), path)


def _truncate(path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def test_atomic_save_survives_a_kill_mid_write_and_resume_removes_its_leftover(make_config):
    cfg = make_config("train.resume=false")
    target = checkpoint_dir(cfg.paths.train_dir) / LAST_NAME
    _save(target, step=1)
    # A child process writes a large checkpoint over it and is killed while writing.
    script = (
        "import sys, torch\n"
        "from pipeline.training.checkpoint_io import AtomicCheckpointIO\n"
        "big = {'global_step': 2, 'hyper_parameters': {}, 'state_dict': "
        "{'w': torch.zeros(64, 1024, 1024)}}\n"  # 256 MiB: several seconds of writing
        "AtomicCheckpointIO().save_checkpoint(big, sys.argv[1])\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(target)])
    temp = target.with_name(f".{target.name}.tmp-{child.pid}")
    deadline = time.monotonic() + 60
    while not (temp.exists() and temp.stat().st_size > 0) and time.monotonic() < deadline:
        assert child.poll() is None, "the child finished before it could be killed"
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert temp.exists(), "the kill should have hit during the write"
    assert read_checkpoint(target)["global_step"] == 1  # the old file is intact
    assert json.loads((target.parent / PROGRESS_NAME).read_text())["step"] == 1

    # The next run removes the dead writer's half-written file, even one that starts anew
    # (which moves the previous run aside).
    with pytest.warns(UserWarning, match="training anew"):
        assert resume_checkpoint(cfg) is None
    assert not temp.exists() and not target.exists()


def test_disk_full_while_saving_keeps_the_previous_checkpoint(small_disk):
    directory = checkpoint_dir(small_disk.path)
    target = directory / LAST_NAME
    _save(target, step=1)
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    small_disk.fill(free=64 * 1024)
    big = {"global_step": 2, "hyper_parameters": {}, "state_dict": {"w": torch.zeros(512, 1024)}}
    with pytest.raises(DiskFullError) as full:  # a real ENOSPC from a real (tmpfs) filesystem
        AtomicCheckpointIO().save_checkpoint(big, target)
    assert str(full.value).startswith(
        f"{target}: disk full (no space left on device) while writing it; the previous "
        "last.ckpt is intact. Free space"
    )
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before  # no temp
    assert find_resume_checkpoint(small_disk.path) == target


def test_disk_full_is_recognised_when_a_library_wraps_it(tmp_path):
    """torch.save reports a failed write as a RuntimeError raised during the OSError."""
    existing, new = tmp_path / LAST_NAME, tmp_path / "step-0000002.ckpt"
    _save(existing, step=1)
    before = existing.read_bytes()

    def write_then_fail(f) -> None:
        f.write(b"\0" * 4096)
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos") from None

    with pytest.raises(DiskFullError, match="last.ckpt: disk full .* the previous last.ckpt is"):
        atomic_write(existing, write_then_fail)
    with pytest.raises(DiskFullError, match="step-0000002.ckpt: disk full .*; nothing was written"):
        atomic_write(new, write_then_fail)
    assert existing.read_bytes() == before and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAST_NAME, PROGRESS_NAME]

    def other_failure(f) -> None:
        raise RuntimeError("not a full disk")

    with pytest.raises(RuntimeError, match="not a full disk"):  # other errors pass unchanged
        atomic_write(existing, other_failure)


@pytest.mark.slow
def test_train_stage_on_a_full_disk_exits_2_naming_the_checkpoint_and_resumes_later(
    tokenized_smoke, tmp_path, small_disk
):
    cfg = copy.deepcopy(tokenized_smoke)
    for name in ("metrics_dir", "plots_dir", "wandb_dir", "eval_dir"):
        setattr(cfg.paths, name, str(tmp_path / name))
    cfg.paths.train_dir = str(small_disk.path / "train")
    cfg.model.d_model, cfg.model.heads, cfg.model.d_ff = 32, 2, 64
    cfg.model.encoder_layers = cfg.model.decoder_layers = 1
    cfg.train.max_tokens, cfg.train.max_steps, cfg.train.val_check_interval = 3000, 30, 10
    cfg.train.val_bleu, cfg.train.progress_bar = False, False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    stage = [sys.executable, "-m", "pipeline.stages.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A checkpoint here is ~0.7 MB; step 10 writes three (step-10, last, best). Room for one
    # more: at step 20, step-0000020.ckpt fits and the new last.ckpt does not.
    small_disk.fill(free=3 * 1024 * 1024 + 300 * 1024)
    result = subprocess.run(stage, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    last = checkpoint_dir(cfg.paths.train_dir) / LAST_NAME
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"error: {last}: disk full (no space left on device) while writing it; the " \
        "previous last.ckpt is intact" in result.stderr  # fmt: skip
    assert read_checkpoint(last)["global_step"] == 10
    assert not [p for p in last.parent.iterdir() if p.name.startswith(".")]  # no temp files

    (small_disk.path / ".filler").unlink()  # space freed: the same command resumes
    result = subprocess.run(stage, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "metrics_dir" / "train.json").read_text())
    # step-0000020.ckpt was written before the disk ran full: the newer one is resumed from.
    assert summary["resumed_from"] == str(last.with_name("step-0000020.ckpt"))
    assert summary["steps"] == 30


def test_save_records_progress(tmp_path):
    _save(tmp_path / "step-0000005.ckpt", step=5)
    assert json.loads((tmp_path / PROGRESS_NAME).read_text()) == {
        "step": 5,
        "file": "step-0000005.ckpt",
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_resume_discovery_fresh_and_last(tmp_path):
    assert find_resume_checkpoint(tmp_path) is None
    directory = checkpoint_dir(tmp_path)
    _save(directory / "step-0000010.ckpt", step=10)
    _save(directory / LAST_NAME, step=10)
    assert find_resume_checkpoint(tmp_path) == directory / LAST_NAME


def test_resume_falls_back_from_a_corrupt_last_checkpoint(tmp_path):
    directory = checkpoint_dir(tmp_path)
    _save(directory / "step-0000010.ckpt", step=10)
    _save(directory / "step-0000020.ckpt", step=20)
    _save(directory / LAST_NAME, step=30)
    _truncate(directory / LAST_NAME)
    with pytest.warns(UserWarning, match="resuming from .*step-0000020.ckpt"):
        assert find_resume_checkpoint(tmp_path) == directory / "step-0000020.ckpt"


def _flip_a_byte_of_tensor_data(path) -> None:
    """Damage the file as a bad disk or copy would: one byte in the middle of the last (the
    largest) tensor record of the archive; its size and structure stay intact."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    with open(path, "r+b") as f:
        f.seek(record.header_offset)
        header = f.read(30)  # the local file header: the data follows its name and extra field
        name_length, extra_length = (int.from_bytes(header[i : i + 2], "little") for i in (26, 28))
        f.seek(record.header_offset + 30 + name_length + extra_length + record.file_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_flipped_byte_in_tensor_data_is_a_corrupt_checkpoint(tmp_path):
    path = tmp_path / "step-0000010.ckpt"
    big = _checkpoint(10)
    big["state_dict"]["model.weight"] = torch.randn(256, 256)
    AtomicCheckpointIO().save_checkpoint(big, path)
    _flip_a_byte_of_tensor_data(path)
    assert torch.load(path, weights_only=True)["global_step"] == 10  # torch loads it silently
    with pytest.raises(DataError, match="step-0000010.ckpt: corrupt checkpoint \\(CRC mismatch"):
        read_checkpoint(path)
    with pytest.raises(DataError, match="corrupt checkpoint"):
        average_checkpoints([path])


def test_resume_takes_a_step_checkpoint_newer_than_last(tmp_path):
    directory = checkpoint_dir(tmp_path)
    _save(directory / "step-0000010.ckpt", step=10)
    _save(directory / LAST_NAME, step=10)
    _save(directory / "step-0000020.ckpt", step=20)  # killed before last.ckpt was rewritten
    with pytest.warns(UserWarning, match="step-0000020.ckpt \\(step 20\\): it is newer than"):
        assert find_resume_checkpoint(tmp_path) == directory / "step-0000020.ckpt"


def test_a_versioned_last_checkpoint_of_older_code_becomes_last_ckpt(tmp_path):
    """A run resumed by older code went on in `last-v1.ckpt`, `last-v2.ckpt`: resume takes the
    newest of them back as `last.ckpt`, with no `-vN` sibling left."""
    directory = checkpoint_dir(tmp_path)
    _save(directory / LAST_NAME, step=51)
    _save(directory / "last-v1.ckpt", step=200, seed=1)
    _save(directory / "last-v2.ckpt", step=120)
    with pytest.warns(UserWarning, match="newest state \\(step 200\\) was in last-v1.ckpt"):
        assert find_resume_checkpoint(tmp_path) == directory / LAST_NAME
    assert sorted(p.name for p in directory.glob("last*")) == [LAST_NAME]
    assert read_checkpoint(directory / LAST_NAME)["global_step"] == 200


def test_resume_sets_aside_newer_corrupt_checkpoints_so_averaging_skips_them(tmp_path):
    directory = checkpoint_dir(tmp_path)
    for step in (10, 20, 30):
        _save(directory / f"step-{step:07d}.ckpt", step=step)
    _save(directory / LAST_NAME, step=20)
    _truncate(directory / "step-0000030.ckpt")
    with pytest.warns(UserWarning, match="Set aside: .*step-0000030.ckpt" + CORRUPT_SUFFIX):
        assert find_resume_checkpoint(tmp_path) == directory / LAST_NAME
    assert (directory / ("step-0000030.ckpt" + CORRUPT_SUFFIX)).exists()  # kept, not deleted
    assert [p.name for p in select_checkpoints(tmp_path, 2, by="last")] == [
        "step-0000020.ckpt",
        "step-0000010.ckpt",
    ]


def test_resume_refuses_a_run_dir_with_progress_but_no_readable_checkpoint(tmp_path):
    directory = checkpoint_dir(tmp_path)
    _save(directory / LAST_NAME, step=30)
    _truncate(directory / LAST_NAME)
    with pytest.raises(DataError, match="last.ckpt: unreadable checkpoint"):
        find_resume_checkpoint(tmp_path)
    (directory / LAST_NAME).unlink()  # the files are gone, the progress record is not
    with pytest.raises(DataError, match="training progress was recorded .*train.resume=false"):
        find_resume_checkpoint(tmp_path)
    moved = move_checkpoints(tmp_path, tmp_path / "aside")
    assert {p.name for p in moved} == {PROGRESS_NAME} and (
        tmp_path / "aside" / PROGRESS_NAME
    ).exists()
    assert find_resume_checkpoint(tmp_path) is None


def test_read_checkpoint_rejects_foreign_files(tmp_path):
    path = tmp_path / "weights.ckpt"
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(DataError, match="weights.ckpt: not a training checkpoint"):
        read_checkpoint(path)


def test_select_last_and_best(tmp_path):
    directory = checkpoint_dir(tmp_path)
    for step, bleu in [(100, 10.5), (200, 14.25), (300, 12.0), (400, 13.0)]:
        _save(directory / f"step-{step:07d}.ckpt", step)
        _save(directory / f"best-step-{step:07d}-bleu-{bleu:.4f}.ckpt", step)
    _save(directory / LAST_NAME, 400)
    last = select_checkpoints(tmp_path, 2, by="last")
    assert [p.name for p in last] == ["step-0000400.ckpt", "step-0000300.ckpt"]
    best = select_checkpoints(tmp_path, 3, by="best")
    assert [p.name for p in best] == [
        "best-step-0000200-bleu-14.2500.ckpt",
        "best-step-0000400-bleu-13.0000.ckpt",
        "best-step-0000300-bleu-12.0000.ckpt",
    ]
    with pytest.warns(UserWarning, match="only 4 exist"):
        assert len(select_checkpoints(tmp_path, 10, by="last")) == 4


def test_select_best_by_loss_prefers_lower(tmp_path):
    directory = checkpoint_dir(tmp_path)
    _save(directory / "best-step-0000100-loss-3.5000.ckpt", 100)
    _save(directory / "best-step-0000200-loss-2.7500.ckpt", 200)
    assert select_checkpoints(tmp_path, 1, by="best")[0].name.endswith("loss-2.7500.ckpt")


def test_select_without_checkpoints_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no step-\\*.ckpt checkpoints"):
        select_checkpoints(tmp_path, 5, by="last")


def test_averaging_two_checkpoints_gives_the_mean_of_their_tensors(tmp_path):
    first, second = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    _save(first, step=1, seed=1)
    _save(second, step=2, seed=2)
    a, b = _checkpoint(1, seed=1)["state_dict"], _checkpoint(2, seed=2)["state_dict"]
    averaged = average_checkpoints([first, second])
    torch.testing.assert_close(
        averaged["model.weight"], (a["model.weight"] + b["model.weight"]) / 2
    )
    assert averaged["model.half"].dtype == torch.bfloat16  # averaged in float64, kept in bf16
    expected_half = ((a["model.half"].double() + b["model.half"].double()) / 2).to(torch.bfloat16)
    torch.testing.assert_close(averaged["model.half"], expected_half)
    assert averaged["model.counter"].tolist() == [2]  # integer buffers: from the last one
    assert average_checkpoints([first])["model.weight"].equal(a["model.weight"])


def test_averaging_refuses_different_models(tmp_path):
    _save(tmp_path / "a.ckpt", step=1)
    other = _checkpoint(2)
    other["state_dict"]["model.extra"] = torch.zeros(1)
    AtomicCheckpointIO().save_checkpoint(other, tmp_path / "b.ckpt")
    with pytest.raises(DataError, match="b.ckpt: its parameters differ .*model.extra"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"])


def test_a_checkpoint_that_would_run_code_is_refused_naming_what_it_holds(malicious_checkpoint):
    """What resume discovery, averaging and the evaluate stage's eval.checkpoint read."""
    with pytest.raises(
        DataError, match=r"evil\.ckpt: refused: loading it would build posix\.system"
    ):
        read_checkpoint(malicious_checkpoint.path)
    assert not malicious_checkpoint.marker.exists()


def test_a_mirror_holds_hard_links_to_exactly_the_saved_checkpoints(tmp_path):
    """What `dvc exp run`'s checkout deletes (the stage's folder) leaves the run in the
    mirror: the same files (hard links, no copy), removals mirrored too."""
    directory, mirror = tmp_path / "train" / "checkpoints", tmp_path / "kept" / "checkpoints"
    writer = AtomicCheckpointIO(mirror=mirror)
    for step in (10, 20):
        writer.save_checkpoint(_checkpoint(step), directory / f"step-{step:07d}.ckpt")
        writer.save_checkpoint(_checkpoint(step), directory / LAST_NAME)
    writer.remove_checkpoint(directory / "step-0000010.ckpt")
    names = sorted(p.name for p in mirror.iterdir())
    assert names == sorted(p.name for p in directory.iterdir()) == [
        LAST_NAME, PROGRESS_NAME, "step-0000020.ckpt"]  # fmt: skip
    assert all(os.path.samefile(mirror / name, directory / name) for name in names)
    shutil.rmtree(directory.parent)
    assert read_checkpoint(mirror / LAST_NAME)["global_step"] == 20
    assert json.loads((mirror / PROGRESS_NAME).read_text())["step"] == 20


def strings_in(tree) -> list[str]:
    """Every string of a loaded checkpoint: its keys and values, at any depth."""
    if isinstance(tree, str):
        return [tree]
    if isinstance(tree, dict):
        return [s for key, value in tree.items() for s in strings_in(key) + strings_in(value)]
    if isinstance(tree, (list, tuple)):
        return [s for item in tree for s in strings_in(item)]
    return []


@pytest.mark.slow
def test_a_checkpoint_names_no_path_of_its_machine_and_its_bookkeeping_survives_a_move(
    trained_smoke, tmp_path, tmp_path_factory, monkeypatch
):
    """A finished run's folder copied elsewhere (another checkout, another machine) and
    extended there: its checkpoints name no absolute path of the folder they were written in
    (the config's paths relative to the working folder, the callbacks' files by name), and the
    callbacks keep their bookkeeping: the run still holds save_top_k step checkpoints, the older
    ones removed, not every file of both folders."""
    import warnings

    from pipeline.training.trainer import run

    base = shared_root(tmp_path_factory)  # where the shared runs and this test's folder are
    monkeypatch.chdir(base)  # a "repository" holding the corpus, the subwords and both runs
    cfg = copy.deepcopy(trained_smoke)
    for name in ("metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(tmp_path / name))
    cfg.paths.train_dir = str(tmp_path / "moved" / "train")
    shutil.copytree(trained_smoke.paths.train_dir, cfg.paths.train_dir)
    folder = checkpoint_dir(cfg.paths.train_dir)
    written_in = str(checkpoint_dir(trained_smoke.paths.train_dir).resolve())
    assert not [s for s in strings_in(read_checkpoint(folder / LAST_NAME)) if written_in in s]

    steps = cfg.train.max_steps
    cfg.train.max_steps = steps + cfg.train.val_check_interval  # one more validation
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "The dirpath has changed ..."
        warnings.filterwarnings("ignore", message=r"(?!The dirpath has changed)")
        run(cfg)
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    k = cfg.train.save_top_k
    assert [n for n in names if n.startswith("step-")] == [
        f"step-{s:07d}.ckpt" for s in range(cfg.train.max_steps, 0, -cfg.train.val_check_interval)
    ][:k][::-1], names
    # The best-k callback's state in last.ckpt is that of the validation before (Lightning saves
    # last.ckpt from the step callback, which runs first): one best file of the copied run may be
    # left beside the k it keeps, never every file of both runs.
    assert k <= len([n for n in names if n.startswith("best-")]) <= k + 1, names
    last = read_checkpoint(folder / LAST_NAME)
    assert last["global_step"] == cfg.train.max_steps
    saved = strings_in(last)
    assert not [s for s in saved if str(base) in s], [s for s in saved if str(base) in s]
    assert last["hyper_parameters"]["config"]["paths"]["train_dir"] == str(
        (tmp_path / "moved" / "train").relative_to(base)
    )
