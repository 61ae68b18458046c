"""DVC stage `tokenize`: prepared text -> joint sentencepiece model + Arrow splits of ids.

python -m pipeline.stages.tokenize     (reads params.yaml; see pipeline.data.tokenized)
"""

from __future__ import annotations

from pipeline import config
from pipeline.cli import main, stage_args
from pipeline.data.tokenized import tokenize


def run() -> dict:
    return tokenize(config.load())


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="tokenize")
