"""No test waits without a timeout, on any machine: every subprocess the tests run and every
process, thread, barrier or event they wait on is given one (read from the tests' source with
`ast`), so a hung child fails its test instead of hanging the suite."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

TESTS = REPO_ROOT / "tests"
RUNS = {"run", "call", "check_call", "check_output"}  # subprocess's, which wait for the child
WAITS = {"wait", "communicate", "join"}  # Popen's, Thread's, Barrier's, Event's, Queue's


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """(line, call) of each wait in `source` that is given no timeout: a subprocess.run (or
    call, check_call, check_output) without `timeout=`, and a `.wait()`, `.communicate()` or
    `.join()` with no argument at all (a `**kwargs` may carry one: it counts as given)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, node.func.value
        keywords = {k.arg for k in node.keywords}
        if "timeout" in keywords or None in keywords:
            continue
        if name in RUNS and isinstance(owner, ast.Name) and owner.id == "subprocess":
            found.append((node.lineno, f"subprocess.{name}"))
        elif name in WAITS and not node.args:
            found.append((node.lineno, f".{name}()"))
    return found


def test_no_test_waits_without_a_timeout():
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {call}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, call in unbounded_waits(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "waits without a timeout (a hung child would hang the suite): "
        + ", ".join(found)
        + ". Fix: pass timeout= (and kill what is still running when it expires)."
    )


def test_the_check_finds_what_it_looks_for():
    source = """
subprocess.run(["git", "status"], check=True)
subprocess.run(["git", "status"], check=True, timeout=60)
subprocess.run(command, **options)
process.wait()
process.wait(timeout=60)
thread.join()
thread.join(5)
", ".join(parts)
barrier.wait()
out, _ = process.communicate()
"""
    assert unbounded_waits(source) == [
        (2, "subprocess.run"), (5, ".wait()"), (7, ".join()"), (10, ".wait()"),
        (11, ".communicate()"),
    ]  # fmt: skip
