"""DVC stage `check`: the whole composed config validated, and the raw corpus recorded, before
any other stage runs (see pipeline.preflight).

python -m pipeline.stages.check     (reads params.yaml; writes paths.corpus_record)
"""

from __future__ import annotations

from pathlib import Path

from pipeline import config, params, preflight
from pipeline.atomic import write_json_atomic
from pipeline.cli import main, stage_args
from pipeline.errors import ConfigError


def run() -> dict:
    try:
        cfg = config.load()
        print(f"experiment '{cfg.experiment_name}' (params.yaml): config valid", flush=True)
        record = preflight.check(cfg)
    except ConfigError as err:
        # `dvc exp run -S key=bad` wrote the value into params.yaml before this stage ran
        if note := params.put_back(err.key):
            raise ConfigError(f"{err}. {note}", key=err.key) from None
        raise
    path = Path(cfg.paths.corpus_record)
    write_json_atomic(path, record)  # unchanged bytes for an unchanged corpus: no re-run
    print(f"corpus: {len(record['files'])} files of {cfg.data.source}, recorded in {path}")
    return record


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="check")
