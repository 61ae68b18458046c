"""params.yaml composed from conf/: the file every DVC stage reads, said aloud.

    python -m pipeline.params [overrides...]     (`make params`; `make repro` runs it first)

DVC composes params.yaml itself on `dvc exp run -S ...` and leaves it so: after
`dvc exp run -S experiment=smoke`, a plain `dvc repro` would run (or find up to date) the
smoke preset. This writes the composition of conf/ with the given overrides (none: the default
experiment), validated, and says which experiment params.yaml now holds and which it replaced.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import OmegaConf

from pipeline import config
from pipeline.atomic import write_text_atomic
from pipeline.cli import PARAMS_FILE, main


def _values(text: str | None) -> dict | None:
    try:
        return yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return None


def write(overrides: list[str], path: Path = Path(PARAMS_FILE)) -> str:
    """Compose, validate and write `path`; returns the line that says what happened."""
    config.compose(overrides)  # validated as every stage will read it
    text = OmegaConf.to_yaml(config.compose_dict(overrides))
    values = _values(text)
    name = values["experiment_name"]
    before = _values(path.read_text(encoding="utf-8")) if path.exists() else None
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


def cli(argv: list[str] | None = None) -> None:
    from pipeline.cli import parser

    cli_parser = parser("pipeline.params", __doc__)
    cli_parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="Hydra overrides: model.heads=4, experiment=smoke, ~experiment",
    )  # fmt: skip
    print(write(cli_parser.parse_args(argv).overrides), flush=True)


if __name__ == "__main__":
    main(cli)
