"""The checks a study spec is held to beyond each key's type and domain (those are declared in
`pipeline.sweep.spec_schema`): names that are folder names, a search space's distributions, a
pruner's options, a grid's size. Each problem is a ConfigError naming the key; those given the
spec's path name the file too (the others are said with it by `spec_schema.validated`)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

# A study or variant name: one folder name (<results-dir>/<study>/,
# <work-dir>/<study>/<variant>-seed<n>/), short enough for the file system's limit on one
NAME_MAX = 100
FOLDER_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}"
CONFIG_KEY = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"  # model.heads, +train.x
OVERRIDE_KEY = rf"[+~]{{0,2}}{CONFIG_KEY}"
SPACE_TYPES = ("categorical", "float", "int")


def _bound_problem(value: Any, kind: str) -> str | None:
    """What is wrong with a distribution's bound of `kind` (int or float), or None."""
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"must be an integer, got {value!r}"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return None if ok else f"must be a finite number, got {value!r}"


def check_distribution(name: str, dist: dict[str, Any]) -> None:
    """A search space entry: {type: categorical, choices: [...]} or {type: float|int, low,
    high, log}, as Optuna's suggest_* take them."""
    kind = dist.get("type")
    if kind not in SPACE_TYPES:
        raise ConfigError(f"key '{name}.type': must be one of {list(SPACE_TYPES)}, "
                          f"got {kind!r}")  # fmt: skip
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log"}
    unknown = sorted(set(dist) - allowed)
    if unknown:
        raise ConfigError(f"key '{name}': unknown key(s) {unknown} for type {kind}; "
                          f"known: {sorted(allowed)}")  # fmt: skip
    if kind == "categorical":
        choices = dist.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"key '{name}.choices': must be a list of at least one "
                              f"value, got {choices!r}")  # fmt: skip
        return
    for bound in ("low", "high"):
        problem = _bound_problem(dist.get(bound), kind)
        if problem:
            raise ConfigError(f"key '{name}.{bound}': {problem}")
    log = dist.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"key '{name}.log': must be true or false, got {log!r}")
    if not dist["low"] < dist["high"] or (log and dist["low"] <= 0):
        raise ConfigError(
            f"key '{name}': needs low < high{' and low > 0 (log)' if log else ''}, "
            f"got low={dist['low']}, high={dist['high']}"
        )


def check_pruner(pruner: dict[str, Any] | None) -> None:
    """`pruner.type` one of PRUNERS, its other keys that pruner's options (built here once, so
    a bad option is refused now rather than in each worker)."""
    if not pruner:
        return
    from pipeline.sweep.pruning import PRUNERS, build_pruner

    kind = pruner.get("type", "median")
    if kind not in PRUNERS:
        raise ConfigError(f"key 'pruner.type': must be one of {sorted(PRUNERS)}, "
                          f"got {kind!r}")  # fmt: skip
    options = {k: v for k, v in pruner.items() if k != "type"}
    try:
        build_pruner(pruner)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"key 'pruner': {kind} pruner refuses {options}: {err}") from None


def check_folder_name(path: Path, key: str, name: Any) -> None:
    """Refuse a study or variant name that is not one folder name: empty, `.` or `..`, holding
    a path separator (an absolute path included), a newline or other character a file name
    should not have, or longer than NAME_MAX, which would put the study's files outside
    --results-dir and --work-dir or fail once storage was written."""
    if isinstance(name, int) and not isinstance(name, bool):
        name = str(name)  # `variants: {1: ...}` in YAML, a folder "1" like a name "1"
    if not isinstance(name, str) or not re.fullmatch(FOLDER_NAME, name):
        raise ConfigError(
            f"{path}: key '{key}': {name!r} is not a folder name (it names the study's or the "
            f"variant's folder); use up to {NAME_MAX} letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )


def check_points(path: str | Path, variants: int, seeds: int, bound: int) -> None:
    if variants * seeds > bound:
        raise ConfigError(
            f"{path}: key 'settings.max_grid_points': the grid holds {variants * seeds} points "
            f"({variants} variants x {seeds} seeds), more than {bound}; every point is "
            "written to the storage when the study is created. Pass --allow-large-grid to run "
            "it, or raise settings.max_grid_points"
        )
