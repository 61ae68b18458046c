"""Ablation report: `python -m pipeline.report <study> [--update-docs]`.

Writes the study's `report.md` and charts into its results folder and prints where, with
`--update-docs` its block on its page docs/ablation-<study>.md and those in docs/index.md and
README.md (where they have one), and one W&B summary run (`--no-wandb` skips); `--transfer` adds whether each finding
holds on each language pair.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import docs_blocks
from pipeline.cli import main
from pipeline.errors import PipelineError
from pipeline.sweep.spec import RESULTS_ROOT, load_spec

if TYPE_CHECKING:
    from pipeline.sweep.spec import StudySpec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "study", help="study name (its spec is ablations/<study>.yaml) or a spec path"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_ROOT,
        help=f"where the studies' folders (records, storage) are (default: {RESULTS_ROOT})",
    )
    docs_blocks.add_update_argument(parser, "the study's page of docs/ (and README.md's summary)")
    parser.add_argument("--no-wandb", action="store_true", help="do not log the W&B summary run")
    parser.add_argument(
        "--transfer",
        action="append",
        default=[],
        metavar="STUDY",
        help="a study of the same grid on another language pair (name or spec path; repeatable):"
        " the report shows whether each finding holds on each pair",
    )
    return parser.parse_args(argv)


def _spec(study: str) -> StudySpec:
    """A study's spec from its name (ablations/<study>.yaml) or a spec path."""
    path = Path(study)
    if path.suffix not in (".yaml", ".yml"):
        path = Path("ablations") / f"{study}.yaml"
    return load_spec(path, allow_large_grid=True)  # reading a study, not creating one


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The statistics, charts and W&B load after the command line is read: `--help` is instant.
    from pipeline.report.docs import not_started, update_docs
    from pipeline.report.document import write_report
    from pipeline.report.records import load_records

    spec = _spec(args.study)
    transfer = tuple(_spec(name) for name in args.transfer)
    study_dir = args.results_dir / spec.study
    if args.update_docs and not_started(study_dir):  # its pages say so; no report yet
        for page in update_docs(spec, study_dir, args.update_docs):
            print(f"updated: {page} (study '{spec.study}' not started)")
        return
    for other in transfer:
        if not load_records(args.results_dir / other.study):
            raise PipelineError(
                f"--transfer {other.study}: no finished trials in "
                f"{args.results_dir / other.study}: run its sweep first"
            )
    report = write_report(spec, study_dir, log_to_wandb=not args.no_wandb, transfer=transfer)
    print(f"report: {report}")
    if args.update_docs:
        for page in update_docs(spec, study_dir, args.update_docs, transfer=transfer):
            print(f"updated: {page}")


def console() -> None:
    """The `transformer-report` command (pyproject.toml)."""
    main(cli)
