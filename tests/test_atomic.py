"""Crash-safe outputs (pipeline.atomic): a folder swapped in whole."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from pipeline.atomic import atomic_directory, atomic_write
from pipeline.errors import DiskFullError


def test_atomic_directory_on_a_full_disk_keeps_the_previous_output(tmp_path):
    """ENOSPC while the new output is written (as `datasets` raises it): a DiskFullError that
    says the previous output is intact, which it is; no staging folder is left behind."""
    target = tmp_path / "tokenized"
    with atomic_directory(target) as staging:
        (staging / "spm.model").write_bytes(b"previous")
    with pytest.raises(DiskFullError, match="tokenized: disk full .*; the previous tokenized is"):
        with atomic_directory(target) as staging:
            (staging / "spm.model").write_bytes(b"new, half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert [p.name for p in tmp_path.iterdir()] == ["tokenized"]
    assert (target / "spm.model").read_bytes() == b"previous"


@pytest.fixture
def read_only_mount(tmp_path):
    """`tmp_path/workspace/eval`, holding the previous output, bind-mounted read-only (as a
    container mounts a folder `:ro`); skipped where this process may not mount."""
    import subprocess

    folder = tmp_path / "workspace" / "eval"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text("{}")
    mounted = subprocess.run(
        ["mount", "--bind", str(folder), str(folder)], capture_output=True, timeout=300
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, timeout=60)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True, timeout=60)


def test_a_read_only_mount_is_named_as_the_folder_to_make_writable(read_only_mount, monkeypatch):
    """A read-only bind mount of `eval/`: replacing the folder, or writing a file in it, is a
    WriteError naming `eval` as the read-only folder (not its writable parent `.`), and the
    previous output is kept with no staging folder beside it."""
    from pipeline.atomic import atomic_write
    from pipeline.errors import WriteError

    monkeypatch.chdir(read_only_mount.parent)
    message = "cannot write it: eval is on a read-only file system .*Mount eval read-write"
    with pytest.raises(WriteError, match=f"^eval: {message}"):
        with atomic_directory("eval") as staging:
            (staging / "metrics.json").write_text('{"bleu": 1}')
    with pytest.raises(WriteError, match=f"^eval/plots/bleu.png: {message}"):
        atomic_write("eval/plots/bleu.png", lambda f: f.write(b"png"))
    assert sorted(p.name for p in read_only_mount.parent.iterdir()) == ["eval"]
    assert (read_only_mount / "metrics.json").read_text() == "{}"


def test_a_write_whose_folder_another_process_removed_midway_is_made_again(tmp_path):
    """The output folder is deleted while the temporary file is written (as DVC's checkout
    does under a running stage): the file is written again and lands whole; a folder that
    keeps vanishing is an error naming the file, not a loop."""
    folder = tmp_path / "checkpoints"
    calls = []

    def write_once_removed(f):
        calls.append(1)
        f.write(b"weights")
        if len(calls) == 1:
            shutil.rmtree(folder)

    atomic_write(folder / "last.ckpt", write_once_removed)
    assert len(calls) == 2 and (folder / "last.ckpt").read_bytes() == b"weights"
    assert [p.name for p in folder.iterdir()] == ["last.ckpt"]  # no temporary file left

    def write_always_removed(f):
        f.write(b"weights")
        shutil.rmtree(folder)

    with pytest.raises(FileNotFoundError, match="last.ckpt"):
        atomic_write(folder / "last.ckpt", write_always_removed)
