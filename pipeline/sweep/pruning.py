"""The study's pruner (`pipeline.sweep.trial_callbacks` reports each validation to it)."""

from __future__ import annotations

import optuna

from pipeline.sweep.spec import PRUNERS, StudySpec


def _pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    if not spec.pruner:
        return optuna.pruners.NopPruner()
    kind = spec.pruner.get("type", "median")  # load_spec checked it and the options
    options = {k: v for k, v in spec.pruner.items() if k != "type"}
    return getattr(optuna.pruners, PRUNERS[kind])(**options)
