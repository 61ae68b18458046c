"""The package's shape, read from its source with `ast` (nothing is imported): no import circle
among pipeline's modules, no module taking a name from the package above it, no private name
used across modules, no module over MAX_LINES lines, no import of the benchmarks from the
package, and benchmarks that stay a small part of the code.

Imports count wherever they stand: a function's lazy import is still a dependency, only deferred.
A name a package exports lazily (`pipeline.lazy.lazy_exports`) counts as an import of the
submodule that defines it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGE = "pipeline"
BENCHMARKS = "benchmarks"
MAX_LINES = 500  # a module longer than this holds more than one idea
MAX_BENCHMARK_SHARE = 0.25  # the lab's harnesses, against the package and themselves together


@dataclass
class Module:
    name: str  # pipeline.sweep.spec
    path: Path
    tree: ast.Module
    lines: int
    is_package: bool
    imports: dict[str, int] = field(default_factory=dict)  # module imported -> first line


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_modules(folder: str) -> dict[str, Module]:
    modules = {}
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = module_name(path)
        modules[name] = Module(name, path, ast.parse(text, str(path)), len(text.splitlines()),
                               path.name == "__init__.py")  # fmt: skip
    return modules


def lazy_exports(package: Module) -> dict[str, str]:
    """{name: submodule} of a package whose `__init__` calls `lazy_exports(__name__, {...})`."""
    found = {}
    for node in ast.walk(package.tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):  # fmt: skip
            for module, names in zip(node.args[1].keys, node.args[1].values):
                for name in getattr(names, "elts", []):
                    found[name.value] = f"{package.name}.{module.value}"
    return found


def absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    base = base[: len(base) - node.level + (1 if module.is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_names(module: Module):
    """(line, module imported, name or None) for every import in `module`, nested ones too."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            for alias in node.names:
                yield node.lineno, source, alias.name


def dependencies(modules: dict[str, Module]) -> dict[str, Module]:
    """Fill each module's `imports` with the pipeline modules it imports."""
    exports = {name: lazy_exports(m) for name, m in modules.items() if m.is_package}
    for module in modules.values():
        for line, source, name in imported_names(module):
            targets = [source]
            if name is not None:
                targets.append(f"{source}.{name}")  # `from pipeline.sweep import pin`
                targets.append(exports.get(source, {}).get(name, ""))
            for target in targets:
                if target in modules and target != module.name:
                    module.imports.setdefault(target, line)
    return modules


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(modules[root].imports)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(modules[target].imports))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def one_cycle(modules: dict[str, Module], component: list[str]) -> str:
    """A shortest way round the circle from its first module, each step with its line."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(modules[node].imports):
            if target == start:
                steps = [*paths[node], start]
                return (
                    " -> ".join(
                        f"{a} (line {modules[a].imports[b]})" for a, b in zip(steps, steps[1:])
                    )
                    + f" -> {start}"
                )
            if target in members and target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return " <-> ".join(component)


def test_no_import_circle_among_the_packages_modules():
    modules = dependencies(read_modules(PACKAGE))
    found = circles(modules)
    assert not found, (
        f"{len(found)} import circle(s) in {PACKAGE}/ (lazy imports count: they only defer the "
        "dependency):\n"
        + "\n".join(f"  {', '.join(c)}\n    e.g. {one_cycle(modules, c)}" for c in found)
        + "\nFix: move what both sides use into the lower module (or a new one both import), "
        "so that imports run one way only; a lazy import does not remove the circle."
    )


def private_imports(folder: str, package_modules: dict[str, Module]) -> list[str]:
    """`from pipeline.x import _name` and `x._name` (x a pipeline module imported by name) in
    the modules of `folder`, other than a module importing its own names."""
    found = []
    for module in read_modules(folder).values():
        aliases = {}
        for line, source, name in imported_names(module):
            if not source.startswith(PACKAGE) or name is None:
                continue
            if f"{source}.{name}" in package_modules:
                aliases[name] = f"{source}.{name}"  # a module, imported by name
            elif name.startswith("_") and source != module.name:
                found.append(f"{module.path.relative_to(REPO_ROOT)}:{line} imports {name} "
                             f"from {source}")  # fmt: skip
        for node in ast.walk(module.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):  # fmt: skip
                found.append(f"{module.path.relative_to(REPO_ROOT)}:{node.lineno} uses "
                             f"{aliases[node.value.id]}.{node.attr}")  # fmt: skip
    return found


def test_no_module_takes_a_name_from_the_package_above_it():
    """A package's `__init__` sits above its modules: it may export them, never the reverse. A
    module that takes a name its own package (or one enclosing it) defines or exports imports
    back up a layer; a submodule reached through its package (`from pipeline.sweep import pin`)
    is not that."""
    modules = read_modules(PACKAGE)
    found = [
        f"{module.path.relative_to(REPO_ROOT)}:{line} takes {name} from {source}"
        for module in modules.values()
        for line, source, name in imported_names(module)
        if name is not None and module.name.startswith(f"{source}.")
        and f"{source}.{name}" not in modules
    ]  # fmt: skip
    assert not found, (
        "modules importing a name from the package above them:\n  "
        + "\n  ".join(found)
        + "\nFix: define the name in a module of its own (the package may export it) and import "
        "it from there."
    )


def test_no_private_name_is_used_across_modules():
    package_modules = read_modules(PACKAGE)
    found = [*private_imports(PACKAGE, package_modules),
             *private_imports(BENCHMARKS, package_modules)]  # fmt: skip
    assert not found, (
        "private (underscore) names used outside the module that defines them:\n  "
        + "\n  ".join(found)
        + "\nFix: what another module uses is public: drop the underscore and name it for what "
        "it does (updating every user), or move it to the module that uses it."
    )


def test_no_module_of_the_package_is_over_the_line_limit():
    long = sorted(
        (m.lines, str(m.path.relative_to(REPO_ROOT))) for m in read_modules(PACKAGE).values()
        if m.lines > MAX_LINES
    )  # fmt: skip
    assert not long, (
        f"modules over {MAX_LINES} lines: "
        + ", ".join(f"{path} ({lines})" for lines, path in long)
        + ". Fix: split each into modules of one idea each (and update its importers; keep "
        "every `python -m` entry point working)."
    )


def test_the_package_does_not_import_the_benchmarks():
    found = [
        f"{module.path.relative_to(REPO_ROOT)}:{line} imports {source}"
        for module in read_modules(PACKAGE).values()
        for line, source, _ in imported_names(module)
        if source == BENCHMARKS or source.startswith(f"{BENCHMARKS}.")
    ]
    assert not found, (
        f"{PACKAGE}/ imports {BENCHMARKS}/, which is not installed with it:\n  "
        + "\n  ".join(found)
        + f"\nFix: move what the package needs into {PACKAGE}/ (benchmarks may import the "
        "package, never the reverse)."
    )


def test_the_benchmarks_stay_under_a_quarter_of_the_code():
    """Every line counts (blank and comment ones too), as `wc -l` over the `*.py` files."""
    benchmarks = read_modules(BENCHMARKS)
    lab = sum(m.lines for m in benchmarks.values())
    package = sum(m.lines for m in read_modules(PACKAGE).values())
    share = lab / (lab + package)
    largest = sorted(((m.lines, str(m.path.relative_to(REPO_ROOT))) for m in benchmarks.values()),
                     reverse=True)[:5]  # fmt: skip
    assert share < MAX_BENCHMARK_SHARE, (
        f"{BENCHMARKS}/ has {lab} lines against {package} in {PACKAGE}/: {share:.1%} of the "
        f"code, over {MAX_BENCHMARK_SHARE:.0%}. Largest: "
        + ", ".join(f"{path} ({lines})" for lines, path in largest)
        + f". Fix: drop what nothing calls, share what the harnesses repeat (benchmarks/common.py)"
        f" and write long code shorter; never move lab code into {PACKAGE}/ to shift the count."
    )


def test_the_model_does_not_import_the_hosts_speed_paths():
    """`pipeline.model` is the paper's model; `pipeline.kernels` installs a host's paths on a
    built one, so only the kernels know the model, never the other way round."""
    found = [
        f"{module.path.relative_to(REPO_ROOT)}:{line} imports {source}"
        for module in read_modules(f"{PACKAGE}/model").values()
        for line, source, _ in imported_names(module)
        if source == f"{PACKAGE}.kernels" or source.startswith(f"{PACKAGE}.kernels.")
    ]
    assert not found, (
        f"{PACKAGE}/model imports {PACKAGE}/kernels:\n  "
        + "\n  ".join(found)
        + "\nFix: build the paper's model there and switch the path on in "
        "`pipeline.kernels.install_speed_paths`."
    )
