"""DVC stage `train`: the Transformer on the tokenized splits -> checkpoints, metrics/train.json.

python -m pipeline.stages.train     (reads params.yaml; see pipeline.training.trainer)
Resumes its own last checkpoint in paths.train_dir when train.resume is true.
"""

from __future__ import annotations

from pipeline import config
from pipeline.cli import main
from pipeline.training import trainer


def run() -> dict:
    return trainer.run(config.load())


if __name__ == "__main__":
    main(run)
