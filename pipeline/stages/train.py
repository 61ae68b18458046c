"""DVC stage `train`: the Transformer on the tokenized splits -> checkpoints, metrics/train.json.

python -m pipeline.stages.train     (reads params.yaml; see pipeline.training.trainer)
Resumes its own last checkpoint in paths.train_dir when train.resume is true. A SIGTERM or
SIGUSR1 at any moment, from the first, ends it with exit code 3 and a message (a checkpoint
once training has started); running it again resumes.
"""

from __future__ import annotations

from pipeline.cli import main, stage_args
from pipeline.training import early_signals


def run() -> dict:
    # torch and Lightning take seconds to load: only after the signal handlers are in place.
    from pipeline import config
    from pipeline.training import trainer

    return trainer.run(config.load())


if __name__ == "__main__":
    early_signals.defer()
    stage_args(__spec__.name, __doc__)
    main(run, stage="train")
