"""DVC stage `summarize`: the train and evaluate records -> metrics/summary.json, the DVC
metrics (see pipeline.summary).

python -m pipeline.stages.summarize     (reads params.yaml)
"""

from __future__ import annotations

from pathlib import Path

from pipeline import config
from pipeline.atomic import write_json_atomic
from pipeline.cli import main, stage_args
from pipeline.summary import SUMMARY_FILE, headline, summarize


def run() -> dict:
    cfg = config.load()
    summary = summarize(cfg)
    write_json_atomic(Path(cfg.paths.metrics_dir) / SUMMARY_FILE, summary)
    print(headline(summary, cfg), flush=True)  # the last line of a run
    return summary


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="summarize")
