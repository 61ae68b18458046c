"""The DVC experiments on one screen of any width (80 columns too): what each changed, its
val and test BLEU (lc), updates and training wall time, best test BLEU first.

    python -m pipeline.experiments            (`make exps`; extra arguments go to `dvc exp show`,
                                               e.g. `-A` for the experiments of every commit)

It reads `dvc exp show --json`. "changed" is what an experiment sets beyond its preset: the
values of its params.yaml that differ from conf/'s composition of `experiment=<its preset>`
(the `-S` values it was run with), led by `experiment=<preset>` when that is not the default,
then the values that tell the listed experiments apart, then those they share.
BLEU (lc) is `eval/val/bleu_lc` and `test/bleu_lc` of `metrics/summary.json`; an experiment
without them (queued, running, failed, or recorded before the summary carried them) shows `-`
and sorts last. A column too narrow for its text ends it with `…`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from pipeline import config as config_lib
from pipeline.cli import main, positive_int
from pipeline.cli import parser as cli_parser
from pipeline.errors import ConfigError, PipelineError
from pipeline.summary import SUMMARY_FILE

METRICS_FILE = f"metrics/{SUMMARY_FILE}"  # dvc.yaml's metrics, relative to the repository
PARAMS_FILE = "params.yaml"
VAL, TEST = "eval/val/bleu_lc", "test/bleu_lc"
STEPS, WALL_TIME = "train/steps", "train/wall_time_s"
PRESET_KEY = "experiment_name"
NAME_WIDTH = 20  # at most; "changed" takes what the numbers leave
MIN_CHANGED_WIDTH = 10
NUMBER_COLUMNS = (("val", 5), ("test", 5), ("updates", 7), ("train min", 9))
GAP = "  "


@dataclass
class Row:
    name: str
    changed: dict[str, str] | None  # None: no params recorded
    val: float | None
    test: float | None
    steps: int | None
    wall_time_s: float | None
    state: str = ""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"model": {"heads": 4}}` -> `{"model.heads": 4}` (lists stay values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


class Presets:
    """conf/'s composition of each preset, flattened, composed once per preset."""

    def __init__(self) -> None:
        self._composed: dict[str | None, dict[str, Any]] = {}

    def __call__(self, preset: str | None) -> dict[str, Any]:
        if preset not in self._composed:
            overrides = [] if preset is None else [f"experiment={preset}"]
            from omegaconf import OmegaConf

            try:
                raw = config_lib.compose_dict(overrides)
            except ConfigError:  # a preset conf/ no longer has
                raw = config_lib.compose_dict([])
            self._composed[preset] = flatten(OmegaConf.to_container(raw, resolve=True))
        return self._composed[preset]


def changes(params: dict[str, Any], presets: Presets) -> dict[str, str]:
    """What `params` (an experiment's params.yaml) sets beyond its preset: {key: value as
    `-S` writes it}, `experiment` first where the preset is not the default."""
    preset = params.get(PRESET_KEY)
    base = presets(preset)
    if base.get(PRESET_KEY) != preset:  # the preset is not in conf/: compare with the default
        base = presets(None)
    lead = {"experiment": str(preset)} if preset != presets(None).get(PRESET_KEY) else {}
    return lead | {
        key: _value(value)
        for key, value in flatten(params).items()
        if key != PRESET_KEY and base.get(key, _MISSING) != value
    }


_MISSING = object()


def _value(value: Any) -> str:
    """As a Hydra override writes it: true, null, [a, b]."""
    return json.dumps(value) if not isinstance(value, str) else value


def changed_text(rows: list[Row]) -> dict[int, str]:
    """Each row's changes as text: `experiment=...` first, then the keys whose values differ
    between the rows (what tells them apart), then the keys they share."""
    known = [r.changed for r in rows if r.changed]  # a baseline run of its preset tells nothing
    shared = (
        {k: v for k, v in known[0].items() if all(c.get(k) == v for c in known)} if known else {}
    )
    text = {}
    for i, r in enumerate(rows):
        if r.changed is None:
            text[i] = "-"
            continue
        order = sorted(r.changed, key=lambda k: (k != "experiment", k in shared))
        text[i] = " ".join(f"{k}={r.changed[k]}" for k in order) or "(its preset)"
    return text


def _data(rev: dict) -> dict:
    return rev.get("data") or {}


def _file_data(data: dict, section: str, name: str) -> dict:
    return ((data.get(section) or {}).get(name) or {}).get("data") or {}


def read_rows(shown: list[dict], presets: Presets | None = None) -> list[Row]:
    """One Row per baseline commit and per experiment of `dvc exp show --json` (not the
    workspace: it is the baseline's or an applied experiment's)."""
    presets = presets or Presets()
    rows = []
    for baseline in shown:
        if baseline.get("rev") == "workspace":
            continue
        rows.append(_row(baseline, baseline.get("name") or baseline["rev"][:7], presets))
        for experiment in baseline.get("experiments") or []:
            revs = experiment.get("revs") or []
            if not revs:
                continue
            latest = revs[0]
            name = experiment.get("name") or latest.get("name") or latest["rev"][:7]
            state = (experiment.get("executor") or {}).get("state") or ""
            rows.append(_row(latest, name, presets, state))
    return rows


def _row(rev: dict, name: str, presets: Presets, state: str = "") -> Row:
    data = _data(rev)
    metrics = _file_data(data, "metrics", METRICS_FILE)
    params = _file_data(data, "params", PARAMS_FILE)
    steps = metrics.get(STEPS)
    return Row(
        name=name,
        changed=changes(params, presets) if params else None,
        val=metrics.get(VAL),
        test=metrics.get(TEST),
        steps=int(steps) if steps is not None else None,
        wall_time_s=metrics.get(WALL_TIME),
        state="" if state in ("", "success") else state,
    )


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row], width: int) -> str:
    """`rows`, best test BLEU (lc) first, in lines of at most `width` characters."""
    rows = sorted(rows, key=lambda r: (r.test is None, -(r.test or 0.0), r.name))
    name_width = min(NAME_WIDTH, max([len("experiment")] + [len(r.name) for r in rows]))
    numbers_width = sum(len(GAP) + w for _, w in NUMBER_COLUMNS)
    changed_width = max(MIN_CHANGED_WIDTH, width - name_width - len(GAP) - numbers_width)

    def line(name: str, changed: str, cells: list[str]) -> str:
        numbers = "".join(GAP + cell.rjust(w) for cell, (_, w) in zip(cells, NUMBER_COLUMNS))
        text = _fit(name, name_width).ljust(name_width) + GAP
        return (text + _fit(changed, changed_width).ljust(changed_width) + numbers).rstrip()

    caption = "BLEU (lc)"
    offset = name_width + len(GAP) + changed_width + len(GAP)
    lines = [" " * offset + caption]
    lines.append(line("experiment", "changed", [title for title, _ in NUMBER_COLUMNS]))
    changed = changed_text(rows)
    for i, r in enumerate(rows):
        cells = [
            _number(r.val, 1),
            _number(r.test, 1),
            str(r.steps) if r.steps is not None else r.state or "-",
            "-" if r.wall_time_s is None else f"{r.wall_time_s / 60:.1f}",
        ]
        lines.append(line(r.name, changed[i], [_fit(c, w) for c, (_, w) in
                                               zip(cells, NUMBER_COLUMNS)]))  # fmt: skip
    return "\n".join(lines)


def dvc_exp_show(extra: list[str]) -> list[dict]:
    command = ["dvc", "exp", "show", "--json", *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise PipelineError(
            "dvc not found: activate the environment (`. .venv/bin/activate`)"
        ) from None
    if done.returncode != 0:
        raise PipelineError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return json.loads(done.stdout or "[]")


def cli(argv: list[str] | None = None) -> None:
    parser = cli_parser("pipeline.experiments", __doc__)
    parser.add_argument(
        "--width", type=positive_int, help="line width (default: the terminal's, 80 without one)"
    )
    parser.add_argument("dvc_args", nargs=argparse.REMAINDER, help="passed to `dvc exp show`")
    args = parser.parse_args(argv)
    width = args.width or shutil.get_terminal_size((80, 24)).columns
    print(table(read_rows(dvc_exp_show(args.dvc_args)), width))


if __name__ == "__main__":
    main(lambda: cli(sys.argv[1:]))
