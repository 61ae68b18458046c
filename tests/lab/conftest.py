"""The lab's tests (benchmarks/: speed benchmarks, the fairseq harness, research-only writers)
carry the `lab` marker: `pytest -m "not lab"` runs the product's tests alone."""

from __future__ import annotations

from pathlib import Path

import pytest

LAB_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if LAB_TESTS in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.lab)
