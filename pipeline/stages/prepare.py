"""DVC stage `prepare`: raw parallel corpus -> normalised, filtered text in `paths.prepared`.

python -m pipeline.stages.prepare      (reads params.yaml; see pipeline.data.prepared)
"""

from __future__ import annotations

from pipeline import config
from pipeline.cli import main, stage_args
from pipeline.data.prepared import prepare


def run() -> dict:
    return prepare(config.load())


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="prepare")
