"""Ablation report: `python -m pipeline.report <study> [--update-readme README.md]`.

Made from the study's committed files alone (`ablations/results/<study>/`: the finished trials'
records `trials/<variant>-seed<seed>/`, the references, and `study.db` for the trial states), so
that anyone with a clone re-makes it exactly:
- `report.md`: a Table-3 shaped table, one row per variant: what changed, parameters, val
  perplexity, val and test2016 BLEU (lc) as mean +- std over seeds, the difference to the base,
  the paired-bootstrap p-value of that difference on test2016, and the paper's own Table 3
  difference for the same change (the spec's `paper` entries); then one finding per row;
- charts (PNG): BLEU per variant (every seed a point, the bootstrap interval), perplexity
  against BLEU for the label-smoothing rows, learning curves of val BLEU per variant;
- `--update-readme`: README's block between `<!-- ablation:<study>:begin -->` and
  `<!-- ablation:<study>:end -->` gets the same table and findings (a test checks that the
  committed README equals this command's output);
- one W&B summary run in the study's group with the same table and charts (`--no-wandb` skips).
A search study's report is its trials ranked by the objective.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from pipeline import readme, sweep
from pipeline.cli import main
from pipeline.errors import PipelineError
from pipeline.evaluation import plots, scoring
from pipeline.training.module import LOSS_AVERAGE

BASE_VARIANT = "base"
TEST_SPLIT = "test_2016_flickr"
VAL_SPLIT = "val"
P_METRIC = "bleu_lc"
SIGNIFICANCE = 0.05
CHARTS = {
    "bleu_per_variant": "bleu_per_variant.png",
    "ppl_vs_bleu": "ppl_vs_bleu.png",
    "learning_curves": "learning_curves.png",
}


@dataclass
class TrialRecord:
    """One finished trial, as `pipeline.sweep` records it."""

    folder: Path
    variant: str
    seed: int
    train: dict
    eval: dict
    curve: list[dict]
    run: dict

    def hypotheses(self, split: str) -> list[str]:
        return _read_lines(self.folder / f"{split}.hyp")

    def score(self, split: str, key: str = P_METRIC) -> float:
        return self.eval[split][key]


@dataclass
class VariantRow:
    variant: str
    factor: str
    parameters: int | None
    val_ppl: list[float]
    val_bleu: list[float]
    test_bleu: list[float]
    test_half_widths: list[float]
    seeds: list[int]
    # False where a trial logged its val loss as the mean of the val batches' means (records
    # made before TokenMean, e978b99, carry no `loss_average`)
    ppl_per_token: bool = True
    paper: dict[str, Any] = field(default_factory=dict)
    delta: float | None = None
    p_value: float | None = None
    ppl_delta: float | None = None
    # every seed's val PPL on one side of every base seed's
    ppl_seeds_apart: bool = False

    @property
    def test_mean(self) -> float:
        return statistics.fmean(self.test_bleu)

    @property
    def test_half_width(self) -> float | None:
        return statistics.fmean(self.test_half_widths) if self.test_half_widths else None


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def load_records(study_dir: Path) -> list[TrialRecord]:
    """Every finished trial's record under `study_dir/trials/` (those with a run.json)."""
    records = []
    for folder in sorted((study_dir / "trials").glob("*")):
        if not (folder / sweep.RUN_FILE).exists():
            continue
        run = json.loads((folder / sweep.RUN_FILE).read_text())
        records.append(
            TrialRecord(
                folder=folder,
                variant=run["params"]["variant"],
                seed=int(run["params"]["seed"]),
                train=json.loads((folder / "train.json").read_text()),
                eval=json.loads((folder / "eval.json").read_text()),
                curve=json.loads((folder / "curve.json").read_text()),
                run=run,
            )
        )
    return records


def test_references(spec: sweep.StudySpec) -> list[str]:
    """The study's test2016 references, read from the corpus and normalised as `prepare`
    does (the corpus is never copied into the repository)."""
    from pipeline.data.corpus import clean_split, read_corpus

    data = sweep.point_config(spec, {"seed": spec.seeds[0]}).data
    return clean_split(read_corpus(data)[TEST_SPLIT], data)[0].tgt


def _factor(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(base recipe)"


def variant_rows(
    spec: sweep.StudySpec, records: list[TrialRecord], references: list[str]
) -> list[VariantRow]:
    """One row per variant with finished trials, in the spec's order; each compared with the
    base by a paired bootstrap over the seeds both ran, pooled."""
    by_variant: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)
    rows = []
    for variant, overrides in spec.variants.items():
        group = sorted(by_variant.get(variant, []), key=lambda r: r.seed)
        if not group:
            continue
        rows.append(
            VariantRow(
                variant=variant,
                factor=_factor(overrides),
                parameters=group[0].train.get("num_parameters"),
                val_ppl=[r.train["last"]["val/ppl"] for r in group],
                val_bleu=[r.score(VAL_SPLIT) for r in group],
                test_bleu=[r.score(TEST_SPLIT) for r in group],
                test_half_widths=[
                    r.eval[TEST_SPLIT]["bleu_lc_ci"]
                    for r in group
                    if "bleu_lc_ci" in r.eval[TEST_SPLIT]
                ],
                seeds=[r.seed for r in group],
                ppl_per_token=all(r.run.get("loss_average") == LOSS_AVERAGE for r in group),
                paper=spec.paper.get(variant, {}),
            )
        )
    base = {r.seed: r for r in by_variant.get(BASE_VARIANT, [])}
    base_row = next((r for r in rows if r.variant == BASE_VARIANT), None)
    for row in rows:
        if base_row is None or row is base_row:
            continue
        row.delta = row.test_mean - base_row.test_mean
        row.ppl_delta = statistics.fmean(row.val_ppl) - statistics.fmean(base_row.val_ppl)
        row.ppl_seeds_apart = min(row.val_ppl) > max(base_row.val_ppl) or max(row.val_ppl) < min(
            base_row.val_ppl
        )
        row.p_value = pooled_p_value(base, by_variant[row.variant], references)
    return rows


def pooled_p_value(
    base: dict[int, TrialRecord], variant: list[TrialRecord], references: list[str]
) -> float | None:
    """sacreBLEU's paired bootstrap (1000 resamples, lowercased BLEU) of the variant against
    the base on test2016, the seeds both ran pooled: seed k's hypotheses of each system side by
    side over the test set repeated once per seed."""
    pairs = [(base[r.seed], r) for r in variant if r.seed in base]
    if not pairs:
        return None
    translations = [(b.hypotheses(TEST_SPLIT), r.hypotheses(TEST_SPLIT)) for b, r in pairs]
    return scoring.pooled_paired_bootstrap(translations, references, P_METRIC)


def _mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _paper_cell(paper: dict[str, Any]) -> str:
    if not paper:
        return "-"
    ppl = f" (PPL {paper['ppl']:+.2f})" if paper.get("ppl") is not None else ""
    return f"{paper['bleu']:+.1f}{ppl}, {paper['rows']}"


def grid_table(rows: list[VariantRow]) -> str:
    lines = [
        "| variant | changed | parameters | val PPL | val BLEU (lc) | test2016 BLEU (lc) | "
        "Δ test vs base | p (paired bootstrap) | seeds | paper, Table 3: Δ BLEU (PPL) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        params = f"{r.parameters / 1e6:.2f} M" if r.parameters else "-"
        delta = "-" if r.delta is None else f"{r.delta:+.2f}"
        p_value = "-" if r.p_value is None else f"{r.p_value:.3f}"
        lines.append(
            f"| {r.variant} | {r.factor} | {params} | {_mean_std(r.val_ppl)}{_ppl_mark(r)} | "
            f"{_mean_std(r.val_bleu)} | {_mean_std(r.test_bleu)} | {delta} | {p_value} | "
            f"{', '.join(map(str, r.seeds))} | {_paper_cell(r.paper)} |"
        )
    return "\n".join(lines)


BATCH_MEAN_MARK = " †"


def _ppl_mark(row: VariantRow) -> str:
    return "" if row.ppl_per_token else BATCH_MEAN_MARK


def _all_per_token(rows: list[VariantRow]) -> bool:
    return all(r.ppl_per_token for r in rows)


def ppl_note(rows: list[VariantRow]) -> str:
    """What the PPL column measures, and where a row's was logged as a mean of batch means."""
    note = "val PPL is the last checkpoint's perplexity per target subword"
    if _all_per_token(rows):
        return note + "."
    return (
        f"{note}, except where marked{BATCH_MEAN_MARK}: logged before e978b99 as the mean of "
        "the val batches' means (torchmetrics#3434), so such rows compare with each other (same "
        "val batches), not with perplexities per token."
    )


def _ppl_finding(r: VariantRow) -> str:
    """The val perplexity against the base's, beside the paper's; no test: 'apart' when every
    seed of the variant is on one side of every seed of the base."""
    if r.ppl_delta is None or r.paper.get("ppl") is None:
        return ""
    paper = r.paper["ppl"]
    if not r.ppl_seeds_apart:
        verdict = "seeds overlap"
    elif paper == 0:
        verdict = "seeds apart, where the paper's is unchanged"
    elif (paper > 0) != (r.ppl_delta > 0):
        verdict = "seeds apart, against the paper's direction"
    else:
        verdict = "seeds apart, in the paper's direction"
    return f"; val PPL {r.ppl_delta:+.2f}{_ppl_mark(r)} vs the paper's {paper:+.2f}: {verdict}"


def findings(rows: list[VariantRow]) -> list[str]:
    """One sentence per compared row: does the paper's direction hold here, at p < 0.05? And
    its perplexity beside the paper's."""
    lines = []
    for r in rows:
        if r.delta is None or r.p_value is None:
            continue
        measured = f"{r.delta:+.2f} BLEU (p = {r.p_value:.3f}, {len(r.seeds)} seed(s))"
        significant = r.p_value < SIGNIFICANCE
        if not r.paper:
            verdict = "significant" if significant else "not significant"
            lines.append(
                f"- {r.variant}: {measured}: {verdict}; the paper has no such row{_ppl_finding(r)}."
            )
            continue
        paper = r.paper["bleu"]
        if no_difference := r.paper.get("no_difference"):  # the paper's words: no effect
            verdict = (
                f'significant, where the paper finds no difference ("{no_difference}"): '
                "does not hold"
                if significant
                else f'not significant, as the paper finds ("{no_difference}")'
            )
        elif not significant:
            verdict = "not significant here, so neither confirms nor contradicts"
        elif paper == 0 or (paper > 0) != (r.delta > 0):
            verdict = "significant, against the paper's direction"
        else:
            verdict = "significant, in the paper's direction: holds"
        lines.append(
            f"- {r.variant}: {measured} vs the paper's {paper:+.1f}: {verdict}{_ppl_finding(r)}."
        )
    return lines


def search_table(trials: list[optuna.trial.FrozenTrial]) -> str:
    done = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value, reverse=True
    )
    keys = sorted({k for t in done for k in t.params})
    lines = [
        "| trial | " + " | ".join(keys) + " | objective | test BLEU (lc) |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for t in done:
        values = " | ".join(str(t.params.get(k)) for k in keys)
        test = t.user_attrs.get("test_bleu_lc")
        lines.append(
            f"| {t.number} | {values} | {t.value:.2f} | {'-' if test is None else f'{test:.2f}'} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- charts


def charts(
    spec: sweep.StudySpec, rows: list[VariantRow], records: list[TrialRecord], out: Path
) -> dict[str, Path]:
    made: dict[str, Path] = {}
    if not rows:
        return made
    base = next((r.test_mean for r in rows if r.variant == BASE_VARIANT), None)
    made["bleu_per_variant"] = plots.save_png(
        plots.seed_points_figure(
            [r.variant for r in rows],
            [r.test_bleu for r in rows],
            [r.test_half_width for r in rows],
            ylabel="test2016 BLEU (lc): seeds, mean, 95% bootstrap",
            title=f"{spec.study}: one factor at a time",
            baseline=base,
        ),
        out / CHARTS["bleu_per_variant"],
    )
    smoothing = {
        r.variant: list(zip(r.val_ppl, r.val_bleu))
        for r in rows
        if r.variant == BASE_VARIANT or "train.label_smoothing" in spec.variants[r.variant]
    }
    if len(smoothing) > 1:
        made["ppl_vs_bleu"] = plots.save_png(
            plots.labelled_scatter_figure(
                smoothing,
                xlabel="val perplexity, last checkpoint"
                + (
                    ", per target subword"
                    if _all_per_token(rows)
                    else f" ({BATCH_MEAN_MARK.strip()}: mean of val batch means)"
                ),
                ylabel="val BLEU (lc), averaged checkpoints, beam",
                title="label smoothing: val perplexity against BLEU (paper 5.4)",
            ),
            out / CHARTS["ppl_vs_bleu"],
        )
    curves = {}
    for row in rows:
        runs = [r.curve for r in records if r.variant == row.variant]
        steps = sorted(set.intersection(*({p["step"] for p in c if "val/bleu" in p} for c in runs)))
        if steps:
            by_step = [{p["step"]: p["val/bleu"] for p in c if "val/bleu" in p} for c in runs]
            curves[row.variant] = (steps, [statistics.fmean(c[s] for c in by_step) for s in steps])
    if curves:
        made["learning_curves"] = plots.save_png(
            plots.curves_figure(
                curves, xlabel="update", ylabel="val BLEU (greedy, mean over seeds)",
                title=f"{spec.study}: validation BLEU during training",
            ),
            out / CHARTS["learning_curves"],
        )  # fmt: skip
    return made


# --------------------------------------------------------------------------- the report


def markdown(
    spec: sweep.StudySpec, study_dir: Path, image_prefix: str = "", with_states: bool = True
) -> str:
    """The report's Markdown (table, states, findings, charts), from the committed files."""
    records = load_records(study_dir)
    rows = variant_rows(spec, records, test_references(spec))
    states = trial_states(spec, study_dir) if with_states else ""
    lines = [
        f"Study `{spec.study}`: {len(records)} of {len(spec.grid())} trials finished"
        + (f" ({states})" if states else "")
        + f"; budget {_factor(spec.budget)}.",
        "",
        grid_table(rows),
        "",
        "BLEU (lc) is sacreBLEU's lowercased BLEU of the averaged checkpoints' beam search; "
        f"{ppl_note(rows)} p is sacreBLEU's paired "
        "bootstrap (1000 resamples) of the variant against the base on test2016, the seeds "
        "both ran pooled (each seed's test set side by side). The paper's column is its own "
        "Table 3 difference for the same change (newstest2013, base model, 100k steps).",
        "",
        *(findings(rows) or ["- no variant has been compared with the base yet."]),
        "",
    ]
    lines += [
        f"![{name}]({image_prefix}{CHARTS[name]})"
        for name in CHARTS
        if (study_dir / CHARTS[name]).exists()
    ]
    return "\n".join(lines) + "\n"


def trial_states(spec: sweep.StudySpec, study_dir: Path) -> str:
    database = study_dir / "study.db"
    if not database.exists():
        return ""
    study = optuna.load_study(study_name=spec.study, storage=f"sqlite:///{database.resolve()}")
    counts = {s.name.lower(): 0 for s in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) + " in study.db"


def write_report(spec: sweep.StudySpec, study_dir: Path, log_to_wandb: bool = True) -> Path:
    if spec.kind == "search":
        return _write_search_report(spec, study_dir)
    records = load_records(study_dir)
    if not records:
        raise PipelineError(
            f"{study_dir}: no finished trials of study '{spec.study}' yet: run the sweep first"
        )
    rows = variant_rows(spec, records, test_references(spec))
    figures = charts(spec, rows, records, study_dir)
    report = study_dir / "report.md"
    report.write_text(f"# Ablation study `{spec.study}`\n\n" + markdown(spec, study_dir))
    if log_to_wandb:
        _log_summary(spec, study_dir, rows, figures)
    return report


def _write_search_report(spec: sweep.StudySpec, study_dir: Path) -> Path:
    storage = f"sqlite:///{(study_dir / 'study.db').resolve()}"
    trials = optuna.load_study(study_name=spec.study, storage=storage).get_trials()
    if not trials:
        raise PipelineError(f"study '{spec.study}' has no trials yet: run the sweep first")
    report = study_dir / "report.md"
    report.write_text(f"# Search `{spec.study}`\n\n{search_table(trials)}\n")
    return report


def readme_markers(study: str) -> tuple[str, str]:
    return f"<!-- ablation:{study}:begin -->", f"<!-- ablation:{study}:end -->"


def readme_block(spec: sweep.StudySpec, study_dir: Path, readme: Path) -> str:
    """The generated text between README's markers for this study (charts linked from it)."""
    prefix = Path(os.path.relpath(study_dir.resolve(), readme.resolve().parent)).as_posix()
    # Without the storage's trial states, which change while workers run.
    return markdown(spec, study_dir, image_prefix=f"{prefix}/", with_states=False)


def update_readme(readme_path: Path, block: str, study: str) -> None:
    readme.fill(readme_path, *readme_markers(study), block)


def _log_summary(
    spec: sweep.StudySpec, study_dir: Path, rows: list[VariantRow], figures: dict[str, Path]
) -> None:
    import wandb

    from pipeline.tracking import start_wandb_run

    paths = sweep.TrialPaths(work=study_dir / "summary", record=study_dir / "trials" / "summary")
    cfg = sweep.trial_config(spec, {}, paths)
    run = start_wandb_run(cfg, job_type="report", name=f"{spec.study}-report", group=spec.study)
    try:
        columns = ["variant", "changed", "val_ppl", "val_bleu_lc", "test_bleu_lc", "delta", "p"]
        table = wandb.Table(columns=columns)
        for r in rows:
            table.add_data(r.variant, r.factor, statistics.fmean(r.val_ppl),
                           statistics.fmean(r.val_bleu), r.test_mean, r.delta, r.p_value)  # fmt: skip
        run.log({"ablation_table": table, **{n: wandb.Image(str(p)) for n, p in figures.items()}})
    finally:
        run.finish()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "study", help="study name (its spec is ablations/<study>.yaml) or a spec path"
    )
    parser.add_argument("--results-dir", type=Path, default=sweep.RESULTS_ROOT)
    parser.add_argument("--update-readme", type=Path, help="fill this README's study block")
    parser.add_argument("--no-wandb", action="store_true", help="do not log the W&B summary run")
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec_path = Path(args.study)
    if spec_path.suffix not in (".yaml", ".yml"):
        spec_path = Path("ablations") / f"{args.study}.yaml"
    spec = sweep.load_spec(spec_path)
    study_dir = args.results_dir / spec.study
    report = write_report(spec, study_dir, log_to_wandb=not args.no_wandb)
    if args.update_readme:
        update_readme(
            args.update_readme, readme_block(spec, study_dir, args.update_readme), spec.study
        )
    print(report.read_text(encoding="utf-8"))


def console() -> None:
    """The `transformer-report` command (pyproject.toml)."""
    main(cli)


if __name__ == "__main__":
    console()
