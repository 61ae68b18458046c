"""params.yaml composed from conf/: the file every DVC stage reads, said aloud.

    python -m pipeline.params [overrides...]            (`make params`; `make repro` runs it first)
    python -m pipeline.params experiment=smoke -o -     (print it instead)

DVC composes params.yaml itself on `dvc exp run -S ...` and leaves it so: after
`dvc exp run -S experiment=smoke`, a plain `dvc repro` would run (or find up to date) the
smoke preset. This writes the composition of conf/ with the given overrides (none: the default
experiment), validated as the stages will read it (a refused value exits 2 naming the key and
leaves the old file), and says which experiment params.yaml now holds and which it replaced.
The file's first line names its JSON Schema (conf/params.schema.json), which editors with a
YAML language server complete and check it with (`python -m pipeline.config_reference`).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from pipeline import config
from pipeline.atomic import write_text_atomic
from pipeline.cli import PARAMS_FILE, main
from pipeline.dvc_env import DVC_EXP_NAME
from pipeline.errors import ConfigError

STDOUT = "-"  # -o -: print the composition instead of writing a file


def schema_line(path: Path) -> str:
    """The comment that names params.yaml's JSON Schema to a YAML language server (a path
    relative to the file, or absolute where none leads there)."""
    try:
        where = os.path.relpath(config.SCHEMA_FILE, Path(path).resolve().parent)
    except ValueError:  # another drive
        where = str(config.SCHEMA_FILE)
    return f"# yaml-language-server: $schema={Path(where).as_posix()}\n"


def composed_text(overrides: list[str], path: Path = Path(PARAMS_FILE)) -> str:
    """conf/ composed with `overrides`, validated, as the YAML of params.yaml at `path`."""
    config.compose(overrides)  # validated as every stage will read it
    return schema_line(path) + OmegaConf.to_yaml(config.compose_dict(overrides))


def _values(text: str | None) -> dict | None:
    try:
        return yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return None


def _read(path: Path) -> str | None:
    """The text of `path`; None where there is none or it is not UTF-8 (replaced whole)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def write(overrides: list[str], path: Path = Path(PARAMS_FILE)) -> str:
    """Compose, validate and write `path`; returns the line that says what happened."""
    text = composed_text(overrides, path)
    values = _values(text)
    name = values["experiment_name"]
    before = _values(_read(path))
    source = "conf/" + (f" with {' '.join(overrides)}" if overrides else " (the default)")
    if before == values:  # DVC writes the same values in its own layout: left as it is
        return f"{path}: experiment '{name}', as composed from {source}"
    write_text_atomic(path, text)  # a refused or interrupted write leaves the old file
    if before is None:
        return f"{path}: experiment '{name}', composed from {source}"
    held = before.get("experiment_name", "?") if isinstance(before, dict) else "?"
    return (
        f"{path}: experiment '{name}', recomposed from {source}; it held experiment '{held}'"
        + (" with other values" if held == name else "")
        + " (left by `dvc exp run -S ...` or an edit)"
    )


LOCK_FILE = "dvc.lock"
_ABSENT = object()


def _lookup(tree, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def recorded_params(lock: Path = Path(LOCK_FILE)) -> list[dict]:
    """The params each stage of dvc.lock recorded for the last run DVC recorded ([] where
    there is no readable dvc.lock)."""
    try:
        stages = yaml.safe_load(lock.read_text(encoding="utf-8"))["stages"]
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return []
    return [((stage or {}).get("params") or {}).get(PARAMS_FILE) or {} for stage in stages.values()]


def unreadable(path: Path) -> str | None:
    """Why the YAML file at `path` cannot be read, naming it and the line (None: it reads, or
    there is none)."""
    try:
        text = config.read_text(path)
        yaml.safe_load(text)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"{path}: {err.strerror}"
    except ConfigError as err:
        return str(err)
    except yaml.YAMLError as err:
        return str(config.yaml_error(path, text, err))
    return None


def last_run_value(key: str, recorded: list[dict]):
    """The value `key` had in the `recorded_params` of the last run, or `_ABSENT` where no
    stage recorded it."""
    for params in recorded:
        # a stage may record a whole section ("train") or one key ("data.src_lang")
        for name, value in params.items():
            if key == name:
                return value
            if key.startswith(f"{name}."):
                found = _lookup(value, key[len(name) + 1 :])
                if found is not _ABSENT:
                    return found
    return _ABSENT


def _as_yaml(value) -> str:
    return "<absent>" if value is _ABSENT else yaml.safe_dump(value)


def put_back(key: str | None, path: Path = Path(PARAMS_FILE), lock: Path = Path(LOCK_FILE)) -> str:
    """Under `dvc exp run`, which writes its `-S` values into params.yaml before any stage
    runs, a value the check stage refused is put back as the last recorded run had it (the
    refused key, or the nearest enclosing one the run recorded: a mapping given a new entry),
    so the workspace is left as it was; what happened, as a sentence for the error ("" if
    nothing)."""
    if not key or not os.environ.get(DVC_EXP_NAME):
        return ""
    key = key.split("[", 1)[0]  # an item of a list: the list is what -S set
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return ""
    recorded = recorded_params(lock)
    parts = key.split(".")
    found = next(((".".join(parts[:n]), value) for n in range(len(parts), 0, -1)
                  if (value := last_run_value(".".join(parts[:n]), recorded)) is not _ABSENT),
                 None)  # fmt: skip
    if found is None:
        why = unreadable(lock) or f"no recorded run has '{key}'"
        return (
            f"{path} keeps the refused value ({why}): give it a valid one with -S, or "
            "recompose the file with `make params`"
        )
    name, before = found
    folder, _, leaf = name.rpartition(".")
    parent = config.subtree(values, folder) if folder else values
    # compared as YAML: `true` is no `1`, though Python's True == 1
    if not isinstance(parent, dict) or _as_yaml(parent.get(leaf, _ABSENT)) == _as_yaml(before):
        return ""
    parent[leaf] = before
    write_text_atomic(path, yaml.safe_dump(values, sort_keys=False, allow_unicode=True))
    # A section (a key added to it with `+`) is not printed whole: its name says enough.
    value = "" if isinstance(before, (dict, list)) else f" {before!r},"
    return f"{path}: '{name}' put back to{value} its value in the last run ({lock})"


def cli(argv: list[str] | None = None) -> None:
    """Compose conf/ with the overrides, validate it and write params.yaml (or `-o` elsewhere,
    `-o -` to stdout): a refused value exits 2 naming the key and writes nothing."""
    import sys

    from pipeline.cli import parser

    cli_parser = parser("pipeline.params", __doc__)
    cli_parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="Hydra overrides: model.heads=4, experiment=smoke, ~experiment",
    )  # fmt: skip
    cli_parser.add_argument(
        "-o", "--output", default=PARAMS_FILE,
        help=f"where to write it (default {PARAMS_FILE}; atomically: a refused config leaves the "
        f"old file as it was); {STDOUT}: print it",
    )  # fmt: skip
    args = cli_parser.parse_args(argv)
    if args.output == STDOUT:
        sys.stdout.write(composed_text(args.overrides))
        return
    print(write(args.overrides, Path(args.output)), flush=True)


def console() -> None:
    """The `transformer-config` command (pyproject.toml)."""
    main(cli)


if __name__ == "__main__":
    console()
