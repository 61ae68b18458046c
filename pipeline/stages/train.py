"""DVC stage `train`: the Transformer on the tokenized splits -> checkpoints, metrics/train.json.

python -m pipeline.stages.train     (reads params.yaml; see pipeline.training.trainer)
Resumes its own last checkpoint in paths.train_dir when train.resume is true. A SIGTERM,
SIGUSR1 or SIGINT (Ctrl-C) at any moment, from the first, ends it with exit code 3 and a
message (a checkpoint once training has started); running it again resumes. Under DVC its
checkpoints stay linked beside its output until DVC records them, however it ends
(`pipeline.training.kept_runs`).
"""

from __future__ import annotations

from pipeline.training import early_signals  # imports nothing heavy

if __name__ == "__main__":
    early_signals.defer()  # first: a signal while even the CLI helpers load is kept

from pipeline.cli import main, stage_args  # noqa: E402 (after the handlers are in place)

_train_dir: list[str] = []  # of the run this process trains


def run() -> dict:
    from pipeline import config

    cfg = config.load()  # a bad value is refused before torch and Lightning load (seconds)
    _train_dir.append(cfg.paths.train_dir)
    # torch and Lightning: only after the signal handlers are in place, and the config read.
    from pipeline.training import trainer

    return trainer.run(cfg)


def kept() -> str | None:
    """What is kept of the run, and how to record it, when DVC will not record it."""
    from pipeline.training import kept_runs

    return kept_runs.describe(_train_dir[-1]) if _train_dir and kept_runs.under_dvc() else None


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="train", kept=kept)
