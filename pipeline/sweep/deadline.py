"""`--deadline`: a worker that must stop by a given time (a SLURM `--time` limit, a spot
instance, a machine held for some hours) starts only trials it can finish by then, and at the
deadline stops its running trial at a checkpoint, as a preemption does, and exits 0.

A trial fits when it is expected to finish in the time left (`TrialTimes`: the median of its
variant's finished trials here, every attempt summed; before any of the variant has finished,
its `trial_hours` in the spec scaled by the base's measured time here, then the median over the
study's finished trials, then the spec's `settings.trial_minutes_estimate`). With no figure at
all a trial is started (the deadline still stops it at a checkpoint).
"""

from __future__ import annotations

import contextvars
import datetime
import re
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from pipeline.errors import ConfigError
from pipeline.sweep.claims import grid_point
from pipeline.sweep.spec import BASE_VARIANT, StudySpec

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
    """A duration from now (`90m`, `2h30m`, `3600s`) or a local clock time: `18:40` is the next
    18:40 (tomorrow's once today's has passed, as `shutdown` and `at` read it, so an evening's
    `--deadline 07:00` means the morning), an ISO date and time `2026-11-27T18:40` that one
    moment, refused once past."""
    now = now or datetime.datetime.now()
    spoken = text.strip().lower().replace(" ", "")
    duration = _DURATION.fullmatch(spoken)
    if spoken and duration and any(duration.groups()):
        hours, minutes, seconds = (float(part or 0) for part in duration.groups())
        length = hours * SECONDS_PER_HOUR + minutes * 60 + seconds
        if length <= 0:
            raise ConfigError(f"--deadline {text!r} is no time at all: give a duration such as 2h")
        return Deadline(now.timestamp() + length, text)
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}", spoken):
            clock = datetime.time.fromisoformat(spoken.zfill(5))
            at = datetime.datetime.combine(now.date(), clock)
            if at <= now:
                at += datetime.timedelta(days=1)
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


@dataclass(frozen=True)
class TrialTimes:
    """How long a trial of each variant takes on one worker, in seconds: the median of the
    variant's trials measured here; before any has finished, its `trial_hours` in the spec,
    relative to the base's and times the base's measured time where there is one (the spec's
    hours are relative costs measured on another machine), else as given; then the median over
    every measured trial; then the spec's `settings.trial_minutes_estimate`. One rule for the
    worker's deadline and the report's hours left."""

    measured: Mapping[str | None, list[float]]
    trial_hours: Mapping[str, float]
    estimate_minutes: float | None

    @classmethod
    def of(cls, spec: StudySpec, measured: Iterable[tuple[str | None, float]]) -> TrialTimes:
        """From (variant, seconds) of the finished trials."""
        by_variant: dict[str | None, list[float]] = {}
        for variant, seconds in measured:
            by_variant.setdefault(variant, []).append(seconds)
        return cls(by_variant, spec.trial_hours or {}, spec.settings.trial_minutes_estimate)

    @classmethod
    def of_study(cls, study: optuna.Study, spec: StudySpec) -> TrialTimes:
        """From the study's COMPLETE trials (their `WALL_TIME_ATTR`), read once."""
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return cls.of(spec, ((trial_variant(t), t.user_attrs[WALL_TIME_ATTR]) for t in finished
                             if t.user_attrs.get(WALL_TIME_ATTR) is not None))  # fmt: skip

    def seconds(self, variant: str | None) -> float | None:
        """A trial of `variant` (None: no figure at all)."""
        if of_variant := self.measured.get(variant):
            return statistics.median(of_variant)
        if variant in self.trial_hours:
            base = self.measured.get(BASE_VARIANT)
            if base and self.trial_hours.get(BASE_VARIANT):
                return (
                    statistics.median(base)
                    * self.trial_hours[variant]
                    / self.trial_hours[BASE_VARIANT]
                )
            return self.trial_hours[variant] * SECONDS_PER_HOUR
        if every := [seconds for times in self.measured.values() for seconds in times]:
            return statistics.median(every)
        if self.estimate_minutes is not None:
            return self.estimate_minutes * 60
        return None


def fits(study: optuna.Study, deadline: Deadline | None, spec: StudySpec):
    """A filter of WAITING trials for one claim: those expected to finish before the deadline
    (the study's finished trials read once, as the filter is made)."""
    if deadline is None:
        return lambda trial: True
    times = TrialTimes.of_study(study, spec)

    def trial_fits(trial: optuna.trial.FrozenTrial) -> bool:
        expected = times.seconds(trial_variant(trial))
        return expected is None or expected <= deadline.left()

    return trial_fits


def hours(seconds: float) -> str:
    return f"{seconds / SECONDS_PER_HOUR:.1f} h"
