"""Crash-safe outputs (pipeline.atomic): a folder swapped in whole."""

from __future__ import annotations

import errno
import os

import pytest

from pipeline.atomic import atomic_directory
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
