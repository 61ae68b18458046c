"""A study's progress, from its committed records: the pin it runs at, the trials finished per
variant and per run conditions, the measured time per trial, and the hours left."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import optuna

from pipeline.report.records import RunConditions, TrialRecord
from pipeline.sweep.deadline import SECONDS_PER_HOUR, TrialTimes
from pipeline.sweep.pin import Pin, read_pin_file
from pipeline.sweep.spec import STUDY_DB, StudySpec
from pipeline.sweep.storage import PIN_ATTR


def study_pin(spec: StudySpec, study_dir: Path) -> RunConditions | None:
    """The conditions the study is pinned to: its SQLite storage's `pin`, else the pin its
    workers wrote beside its records (a study on a database server); None: not pinned."""
    database = study_dir / STUDY_DB
    if database.exists():
        storage = f"sqlite:///{database.resolve()}"
        try:
            attrs = optuna.load_study(study_name=spec.study, storage=storage).user_attrs
        except KeyError:  # no such study in that storage
            return None
        pinned = Pin.from_attr(attrs.get(PIN_ATTR))  # as the workers read it
    else:
        pinned = read_pin_file(study_dir)
    return None if pinned is None else RunConditions(**asdict(pinned))


def trial_seconds(record: TrialRecord) -> float:
    """A finished trial's training (every attempt) and evaluation time, in seconds."""
    run = record.run
    return run.get("train_wall_time_s", 0.0) + run.get("eval_wall_time_s", 0.0)


def hours_left(spec: StudySpec, done: list[TrialRecord]) -> float | None:
    """One worker's hours for the planned points without a record in `done`, each at the time
    `TrialTimes` expects of its variant from the finished trials (None: no figure)."""
    finished = {(r.variant, r.seed) for r in done}
    times = TrialTimes.of(spec, ((r.variant, trial_seconds(r)) for r in done))
    expected = [times.seconds(point["variant"]) for point in spec.grid()
                if (point["variant"], point["seed"]) not in finished]  # fmt: skip
    if any(seconds is None for seconds in expected):
        return None
    return sum(expected) / SECONDS_PER_HOUR


def progress(spec: StudySpec, records: list[TrialRecord], pinned: RunConditions) -> str:
    """Where a pinned study stands: trials done per variant (with the measured hours per trial)
    and per run conditions, and the hours left; while it runs, what its estimates are."""
    done = [r for r in records if r.conditions == pinned]
    planned = len(spec.grid())
    lines = [
        f"**Progress**: {len(done)} of {planned} planned trials finished at the study's pin "
        "(its commit, hardware class and precision: the row marked as the pin below)"
        + (
            f"; {len(records) - len(done)} more ran elsewhere and are shown apart"
            if len(done) < len(records)
            else ""
        )
        + ".",
    ]
    if len(done) < planned:
        lines[0] += (
            f" Until all {planned} have finished, the rows below are interim estimates: the "
            f"design is fixed at {len(spec.seeds)} seeds of every variant, so no test is made and "
            "no verdict drawn before then, and nothing in the plan changes on an interim look."
        )
        left = hours_left(spec, done)
        if left is not None:
            from_spec = "its spec's cost relative to the base's, else " if spec.trial_hours else ""
            lines[0] += (
                f" About {left:.1f} hours of one worker are left ({left / 2:.1f} h with two side "
                f"by side), at each variant's measured time per trial, else {from_spec}the "
                "median over the finished trials."
            )
    by_variant: dict[str, list[TrialRecord]] = {}
    for record in done:
        by_variant.setdefault(record.variant, []).append(record)
    lines += [
        "",
        "| variant | seeds finished | hours per trial, median [range] |",
        "|---|---|---|",
    ]
    for variant in spec.variants:
        group = by_variant.get(variant, [])
        hours = sorted(trial_seconds(r) / SECONDS_PER_HOUR for r in group)
        timing = (f"{statistics.median(hours):.2f} [{hours[0]:.2f}, {hours[-1]:.2f}]"
                  if hours else "-")  # fmt: skip
        seeds = ", ".join(str(r.seed) for r in sorted(group, key=lambda r: r.seed))
        lines.append(f"| {variant} | {len(group)} of {len(spec.seeds)}"
                     f"{f' ({seeds})' if seeds else ''} | {timing} |")  # fmt: skip
    conditions = Counter(r.conditions for r in records)
    conditions.setdefault(pinned, 0)
    lines += ["", "| ran at | finished trials |", "|---|---|"]
    for ran_at, count in sorted(conditions.items(), key=lambda item: -item[1]):
        mark = " (the pin)" if ran_at == pinned else ""
        lines.append(f"| {ran_at}{mark} | {count} |")
    return "\n".join(lines)
