"""What a study spec holds and what makes one valid: a pydantic dataclass per section (the spec,
its `objective`, its `settings`), every key with its type, domain, default and meaning, and the
checks that read several keys as model validators.

`validated` turns pydantic's refusal into a ConfigError naming the spec file and key, worded as
the run configuration's refusals are (`pipeline.config`). What needs files (the base
experiment, each variant composed) is checked by `pipeline.sweep.spec.load_spec`.
"""

import functools
import itertools
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from pipeline import config as config_lib
from pipeline.config_schema import NAME_PATTERN, SEED_LIMIT, WHY, Float, Int, Str, key
from pipeline.errors import ConfigError
from pipeline.metric_names import VAL_METRICS, current_metric
from pipeline.sweep.spec_checks import FOLDER_NAME, OVERRIDE_KEY, check_distribution, check_pruner

BASE_VARIANT = "base"  # the variant every other one is compared with
# What a trial's training returns to be optimized (TranslationModule's validation metrics)
OBJECTIVE_METRICS = VAL_METRICS
# A `paper` entry: the paper's own result for a variant (pipeline.report prints and judges it).
PAPER_REQUIRED = {"bleu", "rows"}
PAPER_OPTIONAL = {"ppl", "no_difference"}

# Unknown keys are refused; a number is finite.
SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)
FolderName = Str(FOLDER_NAME)
OverrideKey = Str(OVERRIDE_KEY)
Seed = Int(ge=0, lt=SEED_LIMIT)


def required(meaning: str, why: str = "") -> Any:
    """A key every spec gives (no default), with its meaning and the reason for its domain."""
    return Field(description=meaning, json_schema_extra={WHY: why} if why else None)


def refuse(key_name: str, message: str) -> ConfigError:
    return ConfigError(f"key '{key_name}': {message}", key=key_name)


@dataclass(config=SECTION)
class SweepSettings:
    """How workers cooperate; the same for every study unless a spec overrides it."""

    heartbeat_interval: Int(ge=1) = key(10, "seconds between a running trial's heartbeats")
    grace_period: Int(ge=2) = key(30, "a heartbeat older than this many seconds marks the trial's worker dead (> heartbeat_interval)")  # fmt: skip
    max_retries: Int(ge=0) = key(2, "re-runs of a trial whose worker died (preemptions are not counted)")  # fmt: skip
    grid_ready_timeout: Float(gt=0.0) = key(120.0, "seconds a late worker waits for the creator's grid")  # fmt: skip
    poll_interval: Float(gt=0.0) = key(2.0, "seconds between looks at a study still running elsewhere")  # fmt: skip
    # before any of a variant has finished (a worker's --deadline starts only trials expected
    # to finish in time; then the measured median)
    trial_minutes_estimate: Float(gt=0.0) | None = key(None, "minutes one trial takes on one worker")  # fmt: skip
    # every point is a row of the storage, written when the study is created
    max_grid_points: Int(ge=1) = key(1000, "the most grid points (variants x seeds) a study enqueues without --allow-large-grid")  # fmt: skip

    @model_validator(mode="after")
    def _grace(self) -> "SweepSettings":
        if self.grace_period <= self.heartbeat_interval:
            raise refuse("settings.grace_period", "must exceed settings.heartbeat_interval = "
                         f"{self.heartbeat_interval}, got {self.grace_period} (every running "
                         "trial would look dead)")  # fmt: skip
        return self


@dataclass(config=SECTION)
class Objective:
    """What the study optimizes: a validation metric of the trial's training, and whither."""

    metric: Literal[OBJECTIVE_METRICS] = required("a validation metric of the trial's training")
    direction: Literal["maximize", "minimize"] = required("whither the study drives it")

    @field_validator("metric", mode="before")
    @classmethod
    def _current_name(cls, value: Any) -> Any:
        """A spec of a study begun under a metric's former name (`val/bleu`) reads as today's."""
        return current_metric(value) if isinstance(value, str) else value


@dataclass(config=SECTION)
class StudySpec:
    """A study: its name, kind, base experiment and objective, the points it runs, and what
    the report compares them with."""

    study: FolderName = required("the study's name: its results' folder and storage")
    kind: Literal["grid", "search"] = required("grid: every variant x every seed, each once; search: Optuna's TPE sampler over `space`")  # fmt: skip
    base_experiment: Str(NAME_PATTERN) = required("the preset every trial starts from", why="a file of conf/experiment/")  # fmt: skip
    objective: Objective = required("the metric the study optimizes, and whither")
    budget: dict[OverrideKey, Any] = key(meaning="config overrides applied to every trial", factory=dict)  # fmt: skip
    seeds: Annotated[list[Seed], Field(min_length=1)] = key(meaning="a grid's seeds, each variant run once per seed", factory=lambda: [1], why="what a trial's seed can be")  # fmt: skip
    variants: dict[FolderName, dict[OverrideKey, Any]] = key(meaning="a grid's variants: {name: overrides}", factory=dict)  # fmt: skip
    space: dict[OverrideKey, dict[Str(), Any]] = key(meaning="a search's distributions: {key: {type, choices or low, high, log}}", factory=dict)  # fmt: skip
    n_trials: Int(ge=1) | None = key(None, "a search's finished trials, across workers")
    sampler_seed: Seed = key(0, "a search's TPE sampler seed")
    pruner: dict[Str(), Any] | None = key(None, "a search's pruner: {type, its options}")
    paper: dict[Str(), dict[Str(), Any]] = key(meaning="the paper's own result for a variant, for the report: {variant: {bleu, ppl, rows}}", factory=dict)  # fmt: skip
    # compared beside every variant's comparison with the base, in the same Holm family
    contrasts: list[Annotated[list[FolderName], Field(min_length=2, max_length=2)]] = key(meaning="pairs of variants [a, b] the report compares with each other (a against b)", factory=list)  # fmt: skip
    trial_hours: dict[FolderName, Float(gt=0.0)] = key(meaning="one trial's expected hours per variant on one worker, as the study was sized", factory=dict)  # fmt: skip
    settings: SweepSettings = Field(default_factory=SweepSettings)

    @property
    def metric(self) -> str:
        return self.objective.metric

    @property
    def direction(self) -> str:
        return self.objective.direction

    def grid(self) -> list[dict[str, Any]]:
        """Every (variant, seed) point of the GridSampler space, variant-major as the spec reads."""
        return [
            {"variant": variant, "seed": seed}
            for variant, seed in itertools.product(self.variants, self.seeds)
        ]

    def grid_space(self) -> dict[str, list[Any]]:
        return {"variant": list(self.variants), "seed": list(self.seeds)}

    @model_validator(mode="after")
    def _across_keys(self) -> "StudySpec":
        if self.kind == "grid" and not self.variants:
            raise ConfigError("a grid study needs 'variants'")
        if self.kind == "search" and (not self.space or not self.n_trials):
            raise ConfigError("a search study needs 'space' and 'n_trials'")
        repeated = sorted(seed for seed, count in Counter(self.seeds).items() if count > 1)
        if repeated:
            raise refuse("seeds", f"{repeated} listed twice (a point would run twice)")
        for name, dist in self.space.items():
            check_distribution(f"space.{name}", dist)
        check_pruner(self.pruner)
        _check_paper(self)
        _check_contrasts(self)
        for name in self.trial_hours:
            if name not in self.variants:
                raise refuse(f"trial_hours.{name}", "no such variant")
        # Trials share one prepared + tokenized copy of the data (see ensure_data).
        varied = [*(k for v in self.variants.values() for k in v), *self.space]
        if any(name.startswith("data.") for name in varied):
            raise ConfigError("variants and space may not change data.* keys (trials share one "
                              "tokenized dataset); put data settings in the base experiment or "
                              "the budget")  # fmt: skip
        return self


def _check_paper(spec: StudySpec) -> None:
    for name, entry in spec.paper.items():
        if name not in spec.variants:
            raise ConfigError(f"paper.{name}: no such variant")
        if not PAPER_REQUIRED <= set(entry) or not set(entry) <= PAPER_REQUIRED | PAPER_OPTIONAL:
            raise ConfigError(
                f"paper.{name} needs {sorted(PAPER_REQUIRED)} and may give "
                f"{sorted(PAPER_OPTIONAL)} (no_difference: the paper's words where it finds "
                f"none), got {entry}"
            )


def _check_contrasts(spec: StudySpec) -> None:
    """Each contrast names two different variants, neither the base (every variant is
    compared with the base already), and no pair twice in either order."""
    seen: set[frozenset[str]] = set()
    for index, pair in enumerate(spec.contrasts):
        where = f"contrasts[{index}]"
        unknown = [name for name in pair if name not in spec.variants]
        if unknown:
            raise refuse(where, f"{unknown} not among the variants {list(spec.variants)}")
        if pair[0] == pair[1] or BASE_VARIANT in pair:
            raise refuse(where, f"{pair} must name two variants other than '{BASE_VARIANT}' "
                         "(each variant is compared with the base already)")  # fmt: skip
        if frozenset(pair) in seen:
            raise refuse(where, f"{pair} is listed twice")
        seen.add(frozenset(pair))


ADAPTER = TypeAdapter(StudySpec)
# pydantic's words for a key a section does not have
UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden", "invalid_key")


@functools.cache
def json_schema() -> dict:
    """The JSON Schema of a study spec: every key's type, domain, default and meaning."""
    return ADAPTER.json_schema()


def validated(raw: dict[str, Any], path: Path) -> StudySpec:
    """The spec of the mapping `raw` (read from `path`), every key held to its type and domain
    and the keys to each other; the first problem is a ConfigError naming the file and key."""
    try:
        return ADAPTER.validate_python(raw)
    except ValidationError as err:
        raise refusal(err, path) from None
    except ConfigError as err:  # a model validator's, which knows no file
        raise ConfigError(f"{path}: {err}", key=err.key) from None


def refusal(err: ValidationError, path: Path) -> ConfigError:
    """pydantic's refusal as the spec's: every unknown key of the first section that has one
    (with the keys it has), a missing key, or the first refused key with its domain."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] in UNKNOWN]
    if unknown:
        section = unknown[0]["loc"][:-1]
        prefix = "".join(f"{part}." for part in section)
        names = sorted(prefix + str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == section)
        schema = root = json_schema()
        for part in section:
            schema = config_lib.resolve(schema, root)["properties"][part]
        known = sorted(prefix + name for name in config_lib.resolve(schema, root)["properties"])
        return ConfigError(f"{path}: unknown key(s) {names}; known: {known}")
    first = errors[0]
    if first["type"] == "missing":
        dotted = ".".join(str(part) for part in first["loc"])
        return ConfigError(f"{path}: missing key '{dotted}'", key=dotted)
    name, schema, inside = config_lib.locate(first["loc"], json_schema())
    value = first.get("input")
    if first["type"] == "dataclass_type":
        message = f"must be a mapping of keys, got {value!r}"
    else:
        message = inside + config_lib.refusal(schema, value, config_lib.why(name, json_schema()))
    return ConfigError(f"{path}: key '{name}': {message}", key=name)
