"""Packages whose public names load on first use (PEP 562 module `__getattr__`).

`python -m pipeline.sweep --help` imports the package before argparse runs: a package that
imported every module at once would load torch, Lightning and Optuna (seconds) to print usage.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, modules: dict[str, list[str]]) -> tuple[Callable, list[str]]:
    """The package's `__getattr__` and `__all__` for `{submodule: [names it defines]}`."""
    where = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__, sorted(where)
