"""Typed, validated configuration: the one place settings are read.

`conf/` (Hydra groups) is composed into `params.yaml` by DVC (`dvc exp run -S ...`) or by
`compose()` here (sweeps, tests). Either way the result is merged into the dataclasses of
`pipeline.config_schema`, so an unknown key or a wrongly typed value fails with the key named,
and their validation rejects impossible combinations (heads not dividing d_model, ...) before
any compute is spent.
Nothing below this module reads files or the environment for settings, with one documented
exception: `MULTI30K_DIR` overrides `data.raw_dir` (applied in `load`). A relative
`data.raw_dir` that leaves the repository (the default `../shared/data/multi30k`) is read from
the repository, also where DVC runs the pipeline in a temporary copy of it (`dvc exp run
--queue` or `--temp`: `<repository>/.dvc/tmp/exps/<copy>/`).
"""

from __future__ import annotations

import os
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config_schema import RUNTIME_KEYS, Config, PathsConfig, validate
from pipeline.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RAW_DIR_ENV = "MULTI30K_DIR"
# Where `dvc exp run --queue` and `--temp` run a copy of the repository, inside it.
DVC_TEMP_WORKSPACES = Path(".dvc", "tmp", "exps")


def with_runtime_section(raw: DictConfig | dict, origin: str = "saved config") -> DictConfig | dict:
    """`raw` in today's layout: records and checkpoints written before the host
    knobs had their own section hold them as `train.<key>`; each moves to `runtime.<key>`. A
    config holding one under both names is refused (which value ran is unknown)."""
    train = raw.get("train")
    moved = [key for key in RUNTIME_KEYS if isinstance(train, (dict, DictConfig)) and key in train]
    if not moved:
        return raw
    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=False)
        train = raw["train"]
    runtime = dict(raw.get("runtime") or {})
    for key in moved:
        if key in runtime:
            raise ConfigError(
                f"{origin}: config key 'train.{key}': set as well as 'runtime.{key}' (its "
                f"place now); keep only runtime.{key}"
            )
        runtime[key] = train[key]
    train = {key: value for key, value in train.items() if key not in moved}
    return {**raw, "train": train, "runtime": runtime}


def _to_config(raw: DictConfig | dict, origin: str) -> Config:
    schema = OmegaConf.structured(Config)
    raw = with_runtime_section(raw, origin)
    try:
        merged = OmegaConf.merge(schema, raw)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        first_line = str(err.msg).splitlines()[0]
        if not key:
            key, first_line = _misplaced_container(raw, Config) or ("?", first_line)
        raise ConfigError(f"{origin}: config key '{key}': {first_line}", key=key) from None
    return cfg


def _misplaced_container(
    raw: DictConfig | dict, cls: type, prefix: str = ""
) -> tuple[str, str] | None:
    """The key of `cls` where `raw` holds a list for a mapping or a mapping for a list (which
    OmegaConf's merge refuses without naming a key), and what it must be; or None."""
    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=False)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        name, hint, value = f"{prefix}{f.name}", hints[f.name], raw.get(f.name)
        expected = hint if is_dataclass(hint) else typing.get_origin(hint)
        if typing.get_origin(hint) in (Union, types.UnionType):  # Optional[list[str]]
            expected = typing.get_origin(typing.get_args(hint)[0])
        kind = dict if expected is dict or is_dataclass(expected) else expected
        if isinstance(value, (list, dict)) and kind in (list, dict) and not isinstance(value, kind):
            return name, f"must be a {'list' if kind is list else 'mapping'}, got {value!r}"
        if is_dataclass(hint) and isinstance(value, dict):
            found = _misplaced_container(value, hint, f"{name}.")
            if found:
                return found
    return None


def leaves(tree, prefix: str) -> dict:
    """{"model.heads": 4, ...}: the leaf values of the (dict) subtree at dotted `prefix`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    found = {}
    for key, value in tree.items():
        found.update(leaves(value, f"{prefix}.{key}"))
    return found


def subtree(tree: dict, dotted: str):
    """tree["model"]["heads"] for "model.heads" (None where a part is missing)."""
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def load(path: str | os.PathLike = "params.yaml") -> Config:
    """Read a composed params file (what DVC stages see) into a validated Config."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path} not found: run from the repository root, or compose one with "
            "`python -m pipeline.config > params.yaml`"
        )
    raw = OmegaConf.load(path)
    return finalize(_to_config(raw, str(path)))


def load_paths(path: str | os.PathLike = "params.yaml") -> PathsConfig:
    """The stages' output paths of the params file at `path`, or the defaults where there is
    none (commands run outside a workspace)."""
    return load(path).paths if Path(path).exists() else PathsConfig()


def compose(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> Config:
    """Compose conf/ with Hydra overrides (`model.heads=4`, `experiment=smoke`)."""
    return finalize(_to_config(compose_dict(overrides, config_dir), str(config_dir)))


def compose_dict(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> DictConfig:
    """The raw composed DictConfig: what DVC writes into params.yaml."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
            return hydra_compose("config", overrides=list(overrides or []))
    except HydraException as err:
        raise ConfigError(f"{config_dir}: {err}") from None


def finalize(cfg: Config) -> Config:
    """Apply the documented environment override, read data.raw_dir from the repository (see
    `outside_the_workspace`), then validate."""
    env_dir = os.environ.get(RAW_DIR_ENV)
    if env_dir:
        cfg.data.raw_dir = env_dir
    cfg.data.raw_dir = outside_the_workspace(cfg.data.raw_dir)
    return validate(cfg)


def outside_the_workspace(path: str, cwd: Path | None = None) -> str:
    """`path` as the repository sees it: a relative path that leaves the workspace, read in a
    DVC temporary copy of the repository, points where it would from the repository itself
    (that copy holds the repository's files, not its surroundings). Anything else unchanged."""
    leaves = Path(os.path.normpath(path)).parts[:1] == (os.pardir,)
    if not leaves:
        return path
    cwd = Path.cwd() if cwd is None else cwd
    if cwd.parent.parts[-len(DVC_TEMP_WORKSPACES.parts) :] != DVC_TEMP_WORKSPACES.parts:
        return path
    repository = cwd.parents[len(DVC_TEMP_WORKSPACES.parts)]
    return os.path.normpath(repository / path)


def to_dict(cfg: Config) -> dict:
    """Plain dict of the resolved config (for W&B, checkpoints, reports)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def from_dict(raw: dict) -> Config:
    """Rebuild a Config saved by `to_dict` (checkpoints, sweep trials)."""
    return validate(_to_config(OmegaConf.create(raw), "saved config"))


def cli(argv: list[str] | None = None) -> None:
    """Print the composed config as YAML (what `make params` writes to params.yaml), after
    validating it as the stages will: a bad value exits 2 naming the key, printing nothing."""
    import sys

    from pipeline.cli import parser

    cli_parser = parser(
        "pipeline.config",
        "Compose conf/ with Hydra overrides, validate it, and print it as YAML.",
        epilog="example: python -m pipeline.config experiment=smoke model.heads=4 -o params.yaml",
    )
    cli_parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="Hydra overrides: model.heads=4, experiment=smoke, ~experiment",
    )  # fmt: skip
    cli_parser.add_argument(
        "-o", "--output", type=Path,
        help="write the YAML there (atomically: a refused config leaves the old file as it "
        "was, which `> params.yaml` would empty) instead of to stdout",
    )  # fmt: skip
    args = cli_parser.parse_args(argv)
    if args.output is not None:  # the one writer of params files, which says what it wrote
        from pipeline import params

        print(params.write(args.overrides, args.output), file=sys.stderr)
        return
    raw = compose_dict(args.overrides)
    finalize(_to_config(raw, f"{CONF_DIR} with {' '.join(args.overrides) or 'no overrides'}"))
    sys.stdout.write(OmegaConf.to_yaml(raw))


def console() -> None:
    """The `transformer-config` command (pyproject.toml)."""
    from pipeline.cli import main

    main(cli)


if __name__ == "__main__":  # python -m pipeline.config [overrides...] -o params.yaml
    console()
