"""The study's pruner (`pipeline.sweep.trial_callbacks` reports each validation to it)."""

from __future__ import annotations

from typing import Any

import optuna

# A spec's `pruner.type`: Optuna's pruners by name
PRUNERS = {
    "median": "MedianPruner",
    "hyperband": "HyperbandPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "threshold": "ThresholdPruner",
}


def build_pruner(pruner: dict[str, Any] | None) -> optuna.pruners.BasePruner:
    """The pruner a spec's `pruner` mapping names (`type` and that pruner's options), or none
    (NopPruner). An unknown type is a KeyError, options it refuses a TypeError or ValueError:
    `load_spec` has built it once already, naming the spec's key."""
    if not pruner:
        return optuna.pruners.NopPruner()
    kind = pruner.get("type", "median")
    options = {k: v for k, v in pruner.items() if k != "type"}
    return getattr(optuna.pruners, PRUNERS[kind])(**options)
