"""DVC stage `evaluate`: average checkpoints, beam-search val/test, sacreBLEU -> metrics/eval.json.

python -m pipeline.stages.evaluate     (reads params.yaml; see pipeline.evaluation.evaluate)
"""

from __future__ import annotations

from pipeline import config
from pipeline.cli import main
from pipeline.evaluation import evaluate


def run() -> dict:
    return evaluate.run(config.load())


if __name__ == "__main__":
    main(run, stage="evaluate")
