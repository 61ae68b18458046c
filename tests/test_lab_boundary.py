"""The product never imports the lab: no module of pipeline/ imports benchmarks (the lab may
import pipeline), so the pipeline installs and runs without it."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

LAB = "benchmarks"


def lab_imports(source: str) -> list[str]:
    """The imports of the lab in `source`, at any depth (functions' own imports too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == LAB]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == LAB:
                found.append(node.module)
    return found


def test_no_pipeline_module_imports_the_lab():
    offenders = {
        str(path.relative_to(REPO_ROOT)): found
        for path in sorted((REPO_ROOT / "pipeline").rglob("*.py"))
        if (found := lab_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_check_sees_every_form_of_import():
    source = "import benchmarks.common\ndef f():\n    from benchmarks.fairseq import parity\n"
    assert lab_imports(source) == ["benchmarks.common", "benchmarks.fairseq"]
    assert lab_imports("from pipeline import results\nimport benchmarking\n") == []
