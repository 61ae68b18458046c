"""params.yaml as the last passing check stage read it, to put back when `dvc exp run` refuses.

`dvc exp run -S key=value` recomposes the whole of params.yaml from conf/ (Hydra) before any
stage runs: without `-S experiment=...` the values of the experiment the file held become the
default experiment's. When the check stage then refuses the value, the file is put back byte for
byte as the last passing check read it, provided that copy holds the values of the last run
DVC recorded (dvc.lock): `dvc exp apply` or `git checkout` may have brought in another since,
and then only the refused key is put back (`pipeline.params.put_back`).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from pipeline import params
from pipeline.atomic import write_text_atomic
from pipeline.cli import PARAMS_FILE
from pipeline.config import subtree
from pipeline.dvc_env import DVC_EXP_NAME

# Beside DVC's own temporary files: per clone, never in git, not a DVC output.
COPY = Path(".dvc") / "tmp" / "params.checked.yaml"


def keep(path: Path = Path(PARAMS_FILE), copy: Path = COPY) -> None:
    """Keep the bytes of params.yaml that the check stage found valid (in a DVC repository)."""
    if copy.parent.parent.is_dir():
        copy.parent.mkdir(exist_ok=True)
        write_text_atomic(copy, path.read_text(encoding="utf-8"))


def _same(ours: object, recorded: object) -> bool:
    """Equal values, a number DVC wrote in another form included (`1e-09` for `1.0e-09`,
    which YAML 1.1 reads as a string)."""
    if isinstance(ours, dict) and isinstance(recorded, dict):
        return ours.keys() == recorded.keys() and all(_same(ours[k], recorded[k]) for k in ours)
    if isinstance(ours, list) and isinstance(recorded, list):
        return len(ours) == len(recorded) and all(map(_same, ours, recorded))
    if isinstance(ours, float) and isinstance(recorded, str):
        try:
            return float(recorded) == ours
        except ValueError:
            return False
    return ours == recorded


def _matches_last_run(values: object, lock: Path) -> bool:
    """Whether every param dvc.lock recorded has that value in `values` (True without a
    lock)."""
    if not isinstance(values, dict):
        return False
    return all(_same(params.last_run_value(name, [values]), value)
               for recorded in params.recorded_params(lock)
               for name, value in recorded.items())  # fmt: skip


def put_back(
    key: str | None,
    path: Path = Path(PARAMS_FILE),
    copy: Path = COPY,
    lock: Path = Path(params.LOCK_FILE),
) -> str:
    """Under `dvc exp run`, after the check stage refused `key`: params.yaml put back as the
    last passing check read it (else the refused key alone, as the last recorded run had it);
    what happened, as a sentence for the error ("" if nothing)."""
    if not os.environ.get(DVC_EXP_NAME):
        return ""
    try:
        kept = copy.read_text(encoding="utf-8")
        values = yaml.safe_load(kept)
    except (OSError, yaml.YAMLError):
        return params.put_back(key, path, lock)
    if not _matches_last_run(values, lock):
        return params.put_back(key, path, lock)
    if path.read_text(encoding="utf-8") == kept:
        return ""
    write_text_atomic(path, kept)
    name = key.split("[", 1)[0] if key else None  # an item of a list: the list is what -S set
    folder, _, leaf = (name or "").rpartition(".")
    parent = subtree(values, folder) if folder else values
    kept_value = subtree(values, name) if name else None
    if not name:
        what = "every value put back"
    elif not isinstance(parent, dict) or leaf not in parent:  # added with `+`
        what = f"'{name}' removed and every other value put back"
    elif isinstance(kept_value, (dict, list)):  # a section is not printed whole
        what = f"'{name}' put back and every other value"
    else:
        what = f"'{name}' put back to {kept_value!r} and every other value"
    return f"{path}: {what} as it was, byte for byte (the last run's, {lock})"
