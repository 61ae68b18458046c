"""Ablation report: `python -m pipeline.report <study> [--storage URL]`.

Writes `ablations/results/<study>/`: `report.md` (a Table-3 style table: variant, changed factor,
parameters, val PPL, test BLEU mean +- std over seeds, delta vs base, and the p-value of the
difference from sacreBLEU's paired bootstrap resampling on the test set), `trials.csv` (every
trial), and PNG charts (BLEU per variant with error bars, parameter importances, parallel
coordinates, intermediate values of pruned trials). The same figures go to a W&B summary run
in the study's group.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from pipeline import sweep
from pipeline.cli import main
from pipeline.errors import PipelineError
from pipeline.evaluation import plots, scoring

BASE_VARIANT = "base"


@dataclass
class VariantRow:
    variant: str
    factor: str
    parameters: int | None
    val_ppl: float | None
    bleu: list[float]
    delta: float | None = None
    p_value: float | None = None

    @property
    def bleu_mean(self) -> float:
        return statistics.fmean(self.bleu)

    @property
    def bleu_std(self) -> float:
        return statistics.stdev(self.bleu) if len(self.bleu) > 1 else 0.0


def _read_lines(path: str | Path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _references(trial: FrozenTrial) -> list[str]:
    cfg = trial.user_attrs["config"]
    test_split = cfg["data"]["test_splits"][0]
    return _read_lines(Path(cfg["paths"]["prepared"]) / f"{test_split}.{cfg['data']['tgt_lang']}")


def _factor(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(base recipe)"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def variant_rows(spec: sweep.StudySpec, trials: list[FrozenTrial]) -> list[VariantRow]:
    """Group finished trials by variant; compare each with the base over matching seeds."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and "test_bleu" in t.user_attrs]
    by_variant: dict[str, list[FrozenTrial]] = {}
    for trial in done:
        by_variant.setdefault(trial.params["variant"], []).append(trial)
    rows = []
    for variant, overrides in spec.variants.items():
        group = sorted(by_variant.get(variant, []), key=lambda t: t.params["seed"])
        if not group:
            continue
        rows.append(
            VariantRow(
                variant=variant,
                factor=_factor(overrides),
                parameters=group[0].user_attrs.get("parameters"),
                val_ppl=_mean([t.user_attrs.get("val_ppl") for t in group]),
                bleu=[t.user_attrs["test_bleu"] for t in group],
            )
        )
    base_trials = {t.params["seed"]: t for t in by_variant.get(BASE_VARIANT, [])}
    base_row = next((r for r in rows if r.variant == BASE_VARIANT), None)
    for row in rows:
        if base_row is None or row is base_row:
            continue
        row.delta = row.bleu_mean - base_row.bleu_mean
        row.p_value = _paired_p_value(base_trials, by_variant[row.variant])
    return rows


def _paired_p_value(base: dict[int, FrozenTrial], variant: list[FrozenTrial]) -> float | None:
    """The largest (most conservative) bootstrap p-value over seeds run by both."""
    p_values = []
    for trial in variant:
        base_trial = base.get(trial.params["seed"])
        if base_trial is None:
            continue
        result = scoring.paired_bootstrap(
            _read_lines(base_trial.user_attrs["hypotheses"]),
            _read_lines(trial.user_attrs["hypotheses"]),
            _references(trial),
            metrics=("bleu",),
        )
        p_values.append(result["bleu"].p_value)
    return max(p_values) if p_values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def grid_table(rows: list[VariantRow], metric_name: str) -> str:
    lines = [
        f"| variant | changed factor | parameters | val PPL | {metric_name} mean +- std | seeds "
        "| delta vs base | p (paired bootstrap) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        params = f"{r.parameters / 1e6:.2f}M" if r.parameters else "-"
        delta = "-" if r.delta is None else f"{r.delta:+.2f}"
        lines.append(
            f"| {r.variant} | {r.factor} | {params} | {_fmt(r.val_ppl)} | "
            f"{r.bleu_mean:.2f} +- {r.bleu_std:.2f} | {len(r.bleu)} | {delta} | {_fmt(r.p_value, 3)} |"
        )
    return "\n".join(lines)


def search_table(trials: list[FrozenTrial]) -> str:
    done = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE),
        key=lambda t: t.value,
        reverse=True,
    )
    keys = sorted({k for t in done for k in t.params})
    lines = [
        "| trial | " + " | ".join(keys) + " | val BLEU | test BLEU |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for t in done:
        values = " | ".join(str(t.params.get(k)) for k in keys)
        lines.append(
            f"| {t.number} | {values} | {_fmt(t.value)} | {_fmt(t.user_attrs.get('test_bleu'))} |"
        )
    return "\n".join(lines)


def _save_optuna_figure(draw, study: optuna.Study, path: Path) -> Path | None:
    """Optuna's matplotlib plots; None where the study has nothing to draw yet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks these plots experimental
        try:
            axes = draw(study)
        except (ValueError, RuntimeError):
            return None
    figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
    return plots.save_png(figure, path)


def charts(
    spec: sweep.StudySpec, study: optuna.Study, rows: list[VariantRow], out: Path
) -> dict[str, Path]:
    from optuna.visualization import matplotlib as optuna_plots

    made: dict[str, Path] = {}
    if rows:
        base = next((r.bleu_mean for r in rows if r.variant == BASE_VARIANT), None)
        made["bleu_per_variant"] = plots.plot_bar_chart(
            [r.variant for r in rows],
            [r.bleu_mean for r in rows],
            [r.bleu_std for r in rows],
            out / "bleu_per_variant.png",
            ylabel="test BLEU (mean +- std over seeds)",
            title=f"{spec.study}: one factor at a time",
            baseline=base,
        )
    drawers = {
        "param_importances": optuna_plots.plot_param_importances,
        "parallel_coordinates": optuna_plots.plot_parallel_coordinate,
        "intermediate_values": optuna_plots.plot_intermediate_values,
    }
    for name, draw in drawers.items():
        if name == "param_importances" and len(_complete(study)) < 2:
            continue
        if name == "intermediate_values" and not any(t.intermediate_values for t in study.trials):
            continue
        path = _save_optuna_figure(draw, study, out / f"{name}.png")
        if path:
            made[name] = path
    return made


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def write_report(
    spec: sweep.StudySpec, study: optuna.Study, out: Path, log_to_wandb: bool = True
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    if not trials:
        raise PipelineError(f"study '{spec.study}' has no trials yet: run the sweep first")
    frame = study.trials_dataframe()
    frame = frame.drop(columns=[c for c in frame.columns if c == "user_attrs_config"])
    frame.to_csv(out / "trials.csv", index=False)

    rows = variant_rows(spec, trials) if spec.kind == "grid" else []
    figures = charts(spec, study, rows, out)
    states = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    table = grid_table(rows, "test BLEU") if spec.kind == "grid" else search_table(trials)
    lines = [
        f"# Study `{spec.study}` ({spec.kind}, base experiment `{spec.base_experiment}`)",
        "",
        "Trials: " + ", ".join(f"{n} {k.lower()}" for k, n in states.items() if n),
        f"Objective: {spec.direction} `{spec.metric}`; budget: {_factor(spec.budget)}.",
        "",
        table,
        "",
        "Test BLEU is sacreBLEU (13a, cased) on the first test split; p is the largest paired "
        "bootstrap p-value against the base over the seeds both ran (1000 resamples).",
        "",
    ]
    lines += [f"![{name}]({path.name})" for name, path in figures.items()]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if log_to_wandb:
        _log_summary(spec, out, figures)
    return report


def _log_summary(spec: sweep.StudySpec, out: Path, figures: dict[str, Path]) -> None:
    import wandb

    from pipeline.tracking import start_wandb_run

    # Laid out like a trial's directory, so the run lands beside the trials' W&B runs.
    paths = sweep.TrialPaths(work=out / "summary", record=out / "trials" / "summary")
    cfg = sweep.trial_config(spec, {}, paths)
    run = start_wandb_run(cfg, job_type="report", name=f"{spec.study}-report", group=spec.study)
    try:
        run.log({name: wandb.Image(str(path)) for name, path in figures.items()})
        run.log({"trials": wandb.Table(dataframe=_read_csv(out / "trials.csv"))})
    finally:
        run.finish()


def _read_csv(path: Path):
    import pandas

    return pandas.read_csv(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "study", help="study name (its spec is ablations/<study>.yaml) or a spec path"
    )
    parser.add_argument("--storage", help="SQLAlchemy URL (default: the sweep's SQLite file)")
    parser.add_argument("--results-dir", type=Path, default=sweep.RESULTS_ROOT)
    parser.add_argument("--no-wandb", action="store_true", help="do not log the W&B summary run")
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec_path = Path(args.study)
    if spec_path.suffix not in (".yaml", ".yml"):
        spec_path = Path("ablations") / f"{args.study}.yaml"
    spec = sweep.load_spec(spec_path)
    storage = args.storage or sweep.default_storage(spec, args.results_dir)
    try:
        study = optuna.load_study(study_name=spec.study, storage=storage)
    except KeyError:
        raise PipelineError(f"no study '{spec.study}' in {storage}: run the sweep first") from None
    report = write_report(spec, study, args.results_dir / spec.study, not args.no_wandb)
    print(f"wrote {report}")


if __name__ == "__main__":
    main(cli)
