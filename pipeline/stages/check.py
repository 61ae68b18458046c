"""DVC stage `check`: the whole composed config validated, and the raw corpus recorded, before
any other stage runs (see pipeline.preflight).

python -m pipeline.stages.check     (reads params.yaml; writes paths.corpus_record)
"""

from __future__ import annotations

from pathlib import Path

from pipeline import checked_params, config, preflight
from pipeline.atomic import write_json_atomic
from pipeline.cli import main, stage_args
from pipeline.errors import PipelineError
from pipeline.training import kept_runs


def run() -> dict:
    try:
        cfg = config.load()
        print(f"experiment '{cfg.experiment_name}' (params.yaml): config valid", flush=True)
        record = preflight.check(cfg)
    except PipelineError as err:
        # `dvc exp run -S key=bad` recomposed params.yaml before this stage ran
        if note := checked_params.put_back(getattr(err, "key", None)):
            err.args = (f"{err}. {note}",)
        raise
    checked_params.keep()
    if note := preflight.averaging_note(cfg):
        print(note, flush=True)
    if kept := kept_runs.review(cfg.paths.train_dir):  # forgotten once DVC recorded it
        print(kept, flush=True)
    path = Path(cfg.paths.corpus_record)
    write_json_atomic(path, record)  # unchanged bytes for an unchanged corpus: no re-run
    print(f"corpus: {len(record['files'])} files of {cfg.data.source}, recorded in {path}")
    return record


if __name__ == "__main__":
    stage_args(__spec__.name, __doc__)
    main(run, stage="check")
