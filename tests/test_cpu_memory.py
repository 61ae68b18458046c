"""pipeline.training.cpu_memory: the allocator really keeps large blocks in the heap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.config import compose
from pipeline.errors import ConfigError
from pipeline.training.cpu_memory import ONEDNN_CACHE_ENV, _glibc

# In a fresh interpreter: allocate and free a 20 MiB block, report glibc's mallinfo2 counters
# (hblkhd: bytes in mmapped blocks; uordblks: bytes in use from the heap) while it is held.
PROBE = """
import ctypes, json, sys
from pipeline.training.cpu_memory import configure_cpu_memory, _glibc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = _glibc()
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
applied = configure_cpu_memory(32, 4096) if sys.argv[1] == "tuned" else {}
block = libc.malloc(20 * 2**20)
held = libc.mallinfo2()
libc.free(block)
freed = libc.mallinfo2()
print(json.dumps({"applied": applied, "mmapped_held": held.hblkhd, "heap_held": held.uordblks,
                  "heap_after_free": freed.arena}))
"""

needs_glibc = pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt/mallinfo2 only")


def probe(mode: str, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
        env={**{k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_ENV}, **env}, timeout=300,
    )  # fmt: skip
    return json.loads(result.stdout)


@needs_glibc
def test_large_blocks_come_from_the_heap_and_stay_there():
    default = probe("default")
    assert default["mmapped_held"] >= 20 * 2**20  # glibc's default: a fresh mapping
    tuned = probe("tuned")
    assert tuned["mmapped_held"] < 2**20
    assert tuned["heap_held"] >= 20 * 2**20
    assert tuned["heap_after_free"] >= 20 * 2**20  # not trimmed: the next step reuses it
    assert tuned["applied"] == {ONEDNN_CACHE_ENV: 4096, "mmap_threshold_bytes": 32 * 2**20}


@needs_glibc
def test_a_users_onednn_setting_wins():
    tuned = probe("tuned", **{ONEDNN_CACHE_ENV: "77"})
    assert tuned["applied"][ONEDNN_CACHE_ENV] == 77


@pytest.mark.parametrize("key", ["cpu_mmap_threshold_mb", "onednn_primitive_cache"])
def test_settings_must_be_positive_or_null(key):
    assert getattr(compose([f"runtime.{key}=null"]).runtime, key) is None
    with pytest.raises(ConfigError, match=f"runtime.{key}"):
        compose([f"runtime.{key}=0"])
