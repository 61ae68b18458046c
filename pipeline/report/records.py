"""A study's finished trials as `pipeline.sweep` recorded them, and the run conditions each ran
under: the report compares trials only under one commit, hardware class and precision."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.environment import run_class
from pipeline.metric_names import FORMER_SUMMARY, current_names
from pipeline.sweep.records import CURVE_FILE, RUN_FILE, read_curve
from pipeline.sweep.spec import StudySpec, point_config

TEST_SPLIT = "test_2016_flickr"
VAL_SPLIT = "val"
P_METRIC = "bleu_lc"


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

    @property
    def conditions(self) -> RunConditions:
        """What the trial ran on; every attempt's hardware class, so that a trial resumed on
        another machine matches neither, and the processes it trained on (a resume on another
        count is refused, so its attempts share its record's)."""
        processes = int(self.train.get("world_size") or 1)
        classes = {run_class(a["hardware"], processes) for a in self.run.get("attempts", [])
                   if a.get("hardware")}  # fmt: skip
        classes.add(run_class(self.run.get("hardware") or "unknown hardware", processes))
        return RunConditions(
            commit=self.run.get("commit") or "unknown commit",
            hardware=" + ".join(sorted(classes)),
            precision=self.run.get("precision") or "unknown precision",
        )


@dataclass(frozen=True)
class RunConditions:
    """A study's trials compare only under one commit, hardware class and precision: the same
    config and seed moves by more than many of Table 3's effects between them."""

    commit: str
    hardware: str
    precision: str

    def __str__(self) -> str:
        return f"commit {self.commit}, {self.hardware}, {self.precision}"


def conditions_text(conditions: RunConditions | None) -> str:
    return str(conditions) if conditions else "mixed run conditions (its seeds differ)"


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def load_records(study_dir: Path) -> list[TrialRecord]:
    """Every finished trial's record under `study_dir/trials/` (those with a run.json)."""
    records = []
    for folder in sorted((study_dir / "trials").glob("*")):
        if not (folder / RUN_FILE).exists():
            continue
        run = json.loads((folder / RUN_FILE).read_text())
        records.append(
            TrialRecord(
                folder=folder,
                variant=run["params"]["variant"],
                seed=int(run["params"]["seed"]),
                train=current_names(
                    json.loads((folder / "train.json").read_text()), FORMER_SUMMARY
                ),
                eval=json.loads((folder / "eval.json").read_text()),
                curve=read_curve(folder / CURVE_FILE),
                run=run,
            )
        )
    return records


def test_references(spec: StudySpec) -> list[str]:
    """The study's test2016 references, read from the corpus and normalised as `prepare`
    does (the corpus is never copied into the repository)."""
    from pipeline.data.corpus import clean_split
    from pipeline.data.sources import read_corpus

    data = point_config(spec, {"seed": spec.seeds[0]}).data
    return clean_split(read_corpus(data)[TEST_SPLIT], data)[0].tgt
