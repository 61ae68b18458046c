"""`--deadline`: a worker that must stop by a given time (a SLURM `--time` limit, a spot
instance, a machine held for some hours) starts only trials it can finish by then, and at the
deadline stops its running trial at a checkpoint, as a preemption does, and exits 0.

A trial fits when the study's measured time for its variant (the median of its finished trials'
training and evaluation time, every attempt summed) is no more than the time left. Before any
of the variant has finished: its `trial_hours` in the spec, scaled by the base's measured time
here where the base has one (the spec's hours are relative costs measured elsewhere), then the
spec's `settings.trial_minutes_estimate`, and with neither, the median over the study's finished
trials. With no figure at all a trial is started (the deadline still stops it at a checkpoint).
"""

from __future__ import annotations

import contextvars
import datetime
import re
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from pipeline.errors import ConfigError
from pipeline.sweep.claims import grid_point
from pipeline.sweep.spec import BASE_VARIANT

SECONDS_PER_HOUR = 3600
WALL_TIME_ATTR = "wall_time_s"  # a finished trial's training (all attempts) + evaluation time
# The deadline of the worker running this trial, for the trial's training (`DeadlineCallback`).
CURRENT_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "current_deadline", default=None
)
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s)?")


@dataclass(frozen=True)
class Deadline:
    at: float  # seconds since the epoch
    text: str  # as the user gave it

    def left(self) -> float:
        return self.at - time.time()

    def passed(self) -> bool:
        return self.left() <= 0

    def iso(self) -> str:
        """The deadline as a local ISO time (`parse_deadline` reads it back)."""
        return datetime.datetime.fromtimestamp(self.at).isoformat(timespec="seconds")

    def clock(self) -> str:
        return datetime.datetime.fromtimestamp(self.at).strftime("%Y-%m-%d %H:%M")


def parse_deadline(text: str, now: datetime.datetime | None = None) -> Deadline:
    """A duration from now (`90m`, `2h30m`, `3600s`) or a local clock time (`18:40` today, or
    an ISO date and time `2026-11-27T18:40`). A clock time already past is refused."""
    now = now or datetime.datetime.now()
    spoken = text.strip().lower().replace(" ", "")
    duration = _DURATION.fullmatch(spoken)
    if spoken and duration and any(duration.groups()):
        hours, minutes, seconds = (float(part or 0) for part in duration.groups())
        return Deadline(now.timestamp() + hours * SECONDS_PER_HOUR + minutes * 60 + seconds, text)
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}", spoken):
            clock = datetime.time.fromisoformat(spoken.zfill(5))
            at = datetime.datetime.combine(now.date(), clock)
        else:
            at = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--deadline {text!r}: give a duration (90m, 2h30m, 3600s) or a local clock time "
            "(18:40, or 2026-11-27T18:40)"
        ) from None
    if at.tzinfo is not None:
        at = at.astimezone().replace(tzinfo=None)
    if at <= now:
        raise ConfigError(
            f"--deadline {text!r} is already past ({now:%Y-%m-%d %H:%M} now): give a later "
            "time, or a duration such as 2h"
        )
    return Deadline(at.timestamp(), text)


def trial_variant(trial: optuna.trial.FrozenTrial) -> str | None:
    """A trial's grid variant (`grid_point`)."""
    return grid_point(trial).get("variant")


def spec_seconds(
    variant: str | None, trial_hours: Mapping[str, float], base_seconds: list[float]
) -> float | None:
    """A trial of `variant` by the spec's `trial_hours`: relative to the base's, times the base's
    measured `base_seconds` where there are some, else the hours as given (None: no figure)."""
    if variant not in trial_hours:
        return None
    if base_seconds and trial_hours.get(BASE_VARIANT):
        return statistics.median(base_seconds) * trial_hours[variant] / trial_hours[BASE_VARIANT]
    return trial_hours[variant] * SECONDS_PER_HOUR


def expected_seconds(
    study: optuna.Study,
    variant: str | None,
    estimate_minutes: float | None,
    trial_hours: Mapping[str, float] | None = None,
):
    """How long a trial of `variant` is expected to take here (None: no figure at all)."""
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    timed = [(trial_variant(t), t.user_attrs[WALL_TIME_ATTR]) for t in finished
             if t.user_attrs.get(WALL_TIME_ATTR) is not None]  # fmt: skip
    of_variant = [seconds for name, seconds in timed if name == variant]
    if of_variant:
        return statistics.median(of_variant)
    base = [seconds for name, seconds in timed if name == BASE_VARIANT]
    if (from_spec := spec_seconds(variant, trial_hours or {}, base)) is not None:
        return from_spec
    if estimate_minutes is not None:
        return estimate_minutes * 60
    if timed:
        return statistics.median(seconds for _, seconds in timed)
    return None


def fits(
    study: optuna.Study,
    deadline: Deadline | None,
    estimate_minutes: float | None,
    trial_hours: Mapping[str, float] | None = None,
):
    """A filter of WAITING trials: those expected to finish before the deadline."""

    def trial_fits(trial: optuna.trial.FrozenTrial) -> bool:
        if deadline is None:
            return True
        expected = expected_seconds(study, trial_variant(trial), estimate_minutes, trial_hours)
        return expected is None or expected <= deadline.left()

    return trial_fits


def hours(seconds: float) -> str:
    return f"{seconds / SECONDS_PER_HOUR:.1f} h"
