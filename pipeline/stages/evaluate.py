"""DVC stage `evaluate`: average checkpoints, beam-search val/test, sacreBLEU -> metrics/eval.json.

python -m pipeline.stages.evaluate     (reads params.yaml; see pipeline.evaluation.evaluate)
"""

from __future__ import annotations

from pipeline import config
from pipeline.cli import main, stage_args


def run() -> dict:
    cfg = config.load()  # a bad value is refused before torch loads (seconds)
    from pipeline.evaluation import evaluate

    results = evaluate.run(cfg)
    print(evaluate.results_table(results, cfg), flush=True)
    return results


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="evaluate")
