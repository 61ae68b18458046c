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

import copy
import dataclasses
import difflib
import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import TypeAdapter, ValidationError

from pipeline.config_schema import RUNTIME_KEYS, WHY, Config, PathsConfig, defaults
from pipeline.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RAW_DIR_ENV = "MULTI30K_DIR"
SCHEMA_FILE = CONF_DIR / "params.schema.json"  # params.yaml's JSON Schema, for editors
SCHEMA_DEFAULTS = "schema_defaults"  # Hydra's name for the schema's defaults (conf/config.yaml)
COMPOSITIONS_KEPT = 128  # per process: a report asks for each of a study's variants several times
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
    """`raw` held to the schema: a ConfigError naming the first key it refuses."""
    try:
        if isinstance(raw, DictConfig):
            raw = OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as err:  # an interpolation that does not resolve
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(f"{origin}: config key '{key}': {str(err.msg).splitlines()[0]}",
                          key=key) from None  # fmt: skip
    raw = with_runtime_section(raw, origin)
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: must be a mapping of config keys, got {raw!r}")
    try:
        return ADAPTER.validate_python(raw)
    except ValidationError as err:
        raise validation_error(err, origin) from None


# What the schema says, in words: a refusal names the key, its domain and the value.
ADAPTER = TypeAdapter(Config)
KINDS = {"integer": "an integer", "number": "a number", "string": "a string",
         "boolean": "true or false", "array": "a list", "object": "a mapping"}  # fmt: skip


@functools.cache
def json_schema() -> dict:
    """The JSON Schema of params.yaml (conf/params.schema.json, written by
    `python -m pipeline.config_reference --update-docs`)."""
    schema = ADAPTER.json_schema()
    schema["title"] = "params.yaml"
    schema["description"] = "conf/ composed: what every DVC stage reads (pipeline.config_schema)"
    return schema


def resolve(schema: dict, root: dict | None = None) -> dict:
    """`schema`, or the definition its `$ref` names in `root` (params.yaml's schema)."""
    ref = schema.get("$ref")
    return (root or json_schema())["$defs"][ref.rsplit("/", 1)[1]] if ref else schema


def _branches(schema: dict) -> list[dict]:
    return [resolve(branch) for branch in schema.get("anyOf", [])]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def range_text(schema: dict) -> str:
    low = ("[", schema["minimum"]) if "minimum" in schema else (
        ("(", schema["exclusiveMinimum"]) if "exclusiveMinimum" in schema else None)  # fmt: skip
    high = ("]", schema["maximum"]) if "maximum" in schema else (
        (")", schema["exclusiveMaximum"]) if "exclusiveMaximum" in schema else None)  # fmt: skip
    if low and high:
        return f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {_number(high[1])}"
    return ""


def describe(schema: dict) -> str:
    """The values `schema` takes, in words: ">= 1", "one of ['a', 'b']", "null or ..."."""
    schema = resolve(schema)
    if "anyOf" in schema:
        branches = _branches(schema)
        text = " or ".join(describe(b) for b in branches if b.get("type") != "null")
        return f"null or {text}" if any(b.get("type") == "null" for b in branches) else text
    if "enum" in schema:
        return f"one of {schema['enum']}"
    if "const" in schema:
        return repr(schema["const"])
    kind = schema.get("type")
    if kind in ("integer", "number"):
        if schema.get("minimum") is not None and schema.get("minimum") == schema.get("maximum"):
            meaning = schema.get("description")
            return _number(schema["minimum"]) + (f" ({meaning})" if meaning else "")
        return range_text(schema) or KINDS[kind]
    if kind == "string":
        if "pattern" in schema:
            return f"a string matching {schema['pattern']}"
        return "a non-empty string" if schema.get("minLength") else "a string"
    if kind == "array":
        size = schema.get("minItems")
        count = f" of {size} items" if size is not None and size == schema.get("maxItems") else (
            f" of at least {'one item' if size == 1 else f'{size} items'}" if size else "")  # fmt: skip
        return f"a list{count}, each {describe_item(schema.get('items', {}))}"
    if kind == "object":
        return f"a mapping, each key {describe_item(_key_schema(schema))} and value {describe_item(_entry(schema))}"
    return KINDS.get(kind, "any value")


def describe_item(schema: dict) -> str:
    text = describe(schema)
    kind = kind_of(schema)
    return text if text.startswith(("a ", "one of", "null")) or not kind else f"{kind} {text}"


def kind_of(schema: dict) -> str | None:
    """ "an integer" or "a number" where `schema` is one, for what a range is of."""
    schema = resolve(schema)
    kinds = {b.get("type") for b in _branches(schema)} - {"null"} or {schema.get("type")}
    return KINDS[kinds.pop()] if len(kinds) == 1 and kinds <= {"integer", "number"} else None


def _entry(schema: dict) -> dict:
    """The schema of a mapping's values."""
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return schema["additionalProperties"]
    return next(iter(schema.get("patternProperties", {}).values()), {})


def _key_schema(schema: dict) -> dict:
    if "propertyNames" in schema:
        return schema["propertyNames"]
    pattern = next(iter(schema.get("patternProperties", {})), None)
    return {"type": "string", "pattern": pattern} if pattern else {"type": "string"}


def _without_null(schema: dict) -> dict:
    branches = [b for b in _branches(schema) if b.get("type") != "null"]
    return branches[0] if len(branches) == 1 else schema


def locate(loc: tuple, root: dict | None = None) -> tuple[str, dict, str]:
    """(dotted key, its schema, where inside it: "item 0: ", "entry 'x': " or "") of the value
    a pydantic error's `loc` points at in `root` (params.yaml's schema); a union's member tags
    in `loc` are left out (the refusal describes the whole union)."""
    schema, name, inside = root or json_schema(), "", ""
    for index, part in enumerate(loc):
        schema = resolve(schema, root)
        properties = schema.get("properties", {})
        if not inside and isinstance(part, str) and part in properties:
            name, schema = f"{name}.{part}".lstrip("."), properties[part]
            continue
        inner = _without_null(schema)
        if inner.get("type") == "array" and isinstance(part, int):
            inside, schema = f"{inside}item {part}: ", inner.get("items", {})
        elif inner.get("type") == "object" and "properties" not in inner:
            if loc[index + 1 : index + 2] == ("[key]",):
                return name, _key_schema(inner), f"{inside}key {part!r}: "
            inside, schema = f"{inside}entry {part!r}: ", _entry(inner)
        elif not properties:
            break  # a union's tag
        else:
            return f"{name}.{part}".lstrip("."), {}, inside  # a key the section lacks
    return name, schema, inside


JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
              dict: "object", type(None): "null"}  # fmt: skip


def of_its_type(schema: dict, value: Any) -> bool:
    """Whether `value` is of a type `schema` takes (an integer is a number), whatever its
    range, choices or pattern."""
    branches = _branches(resolve(schema)) or [resolve(schema)]
    kinds = {b.get("type") or JSON_TYPES.get(type(next(iter(b.get("enum", [None])))))
             for b in branches}  # fmt: skip
    kind = JSON_TYPES.get(type(value))
    return kind in kinds or kind == "integer" and "number" in kinds


def why(dotted: str, root: dict | None = None) -> str:
    """The reason given for the domain of the key `dotted` of `root` (params.yaml's schema)."""
    schema = root or json_schema()
    for part in dotted.split("."):
        schema = resolve(schema, root).get("properties", {}).get(part, {})
    return schema.get(WHY, "")


def refusal(schema: dict, value: Any, reason: str = "") -> str:
    """ "must be <domain>, got <value> (<kind>; <reason>)"."""
    said = "; ".join(filter(None, [kind_of(schema), reason]))
    return f"must be {describe(schema)}, got {value!r}" + (f" ({said})" if said else "")


def validation_error(err: ValidationError, origin: str = "") -> ConfigError:
    """pydantic's refusal as the project's: the first refused key, its domain, the value and,
    for an unknown key, the declared key nearest to it. An unknown key or a value of the wrong
    type is said with `origin` (the file or composition holding it)."""
    first = err.errors()[0]
    key, schema, inside = locate(first["loc"])
    value = first.get("input")
    if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        section = key.rpartition(".")[0] or "the top level"
        message = f"not a key of {section}"
        if nearest := _nearest_key(key):
            message += f"; did you mean '{nearest}'?"
    elif first["type"] == "dataclass_type":
        message = f"must be a mapping of keys, got {value!r}"
    else:
        message = inside + refusal(schema, value, why(key))
        if of_its_type(schema, value):  # a value out of range or choices: the key says enough
            origin = ""
    where = f"{origin}: " if origin else ""
    return ConfigError(f"{where}config key '{key}': {message}", key=key)


def _nearest_key(key: str) -> str | None:
    """The declared key nearest to the unknown dotted `key` (a typo: `model.headz` ->
    `model.heads`), or None where none is close."""
    *sections, leaf = key.split(".")
    schema = json_schema()
    for section in sections:
        schema = resolve(schema).get("properties", {}).get(section, {})
    known = list(resolve(schema).get("properties", {}))
    close = difflib.get_close_matches(leaf, known, n=1)
    return ".".join([*sections, close[0]]) if close else None


def validate(cfg: Config) -> Config:
    """`cfg`, changed since it was built, held to the schema again (a new Config)."""
    return _to_config(to_dict(cfg), "config")


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
            "`python -m pipeline.params`"
        )
    return finalize(_to_config(read_yaml(path), str(path)))


def yaml_error(path: Path, text: str, err: Exception) -> ConfigError:
    """The ConfigError for `text` (of `path`) that is not YAML: file, line and column first."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if mark is not None:
        where = f"{mark.line + 1}:{mark.column + 1}"
    else:  # the reader's error: a character YAML does not allow, at an offset
        position = getattr(err, "position", 0)
        line = text.count("\n", 0, position) + 1
        where = f"{line}:{position - (text.rfind(chr(10), 0, position) + 1) + 1}"
    reason = getattr(err, "problem", None) or str(err).splitlines()[0]
    return ConfigError(f"{path}:{where}: not valid YAML ({reason})")


def read_text(path: Path) -> str:
    """The UTF-8 text of `path`; other bytes are a ConfigError naming the file and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})"
        ) from None


def read_yaml(path: Path) -> DictConfig:
    """A YAML file as OmegaConf reads it; bytes that are not UTF-8 text or not YAML are a
    ConfigError naming the file and line (`make params` composes params.yaml anew)."""
    import io

    import yaml

    hint = "fix it or compose it anew with `make params` (python -m pipeline.params)"
    try:
        text = read_text(path)
        return OmegaConf.load(io.StringIO(text))
    except ConfigError as err:
        raise ConfigError(f"{err}: {hint}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{yaml_error(path, text, err)}: {hint}") from None


def load_paths(path: str | os.PathLike = "params.yaml") -> PathsConfig:
    """The stages' output paths of the params file at `path`, or the defaults where there is
    none (commands run outside a workspace)."""
    return load(path).paths if Path(path).exists() else PathsConfig()


def compose(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> Config:
    """Compose conf/ with Hydra overrides (`model.heads=4`, `experiment=smoke`)."""
    return finalize(_to_config(compose_dict(overrides, config_dir), str(config_dir)))


def register_schema_defaults() -> None:
    """Put every key's default (`pipeline.config_schema`) in Hydra's store as SCHEMA_DEFAULTS,
    the first entry of conf/config.yaml's defaults list: conf/ then sets only what a recipe
    changes, and a composition holds every key (an override without `+` finds it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_DEFAULTS, node=defaults())


def compose_dict(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> DictConfig:
    """The raw composed DictConfig: what DVC writes into params.yaml. A process keeps the
    compositions it made (a report composes each variant several times), keyed by the
    overrides and by the digest of conf/'s files, so that an edited conf/ composes anew; each
    caller gets its own copy to change."""
    directory = Path(config_dir).resolve()
    digest = hashlib.blake2b()
    for path in sorted(directory.rglob("*.yaml")):
        digest.update(f"{path.relative_to(directory)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return copy.deepcopy(_composed(tuple(overrides or []), directory, digest.hexdigest()))


@functools.lru_cache(maxsize=COMPOSITIONS_KEPT)
def _composed(overrides: tuple[str, ...], config_dir: Path, files_digest: str) -> DictConfig:
    """Hydra's composition of `config_dir` (`files_digest` only keys the cache)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    register_schema_defaults()
    try:
        with initialize_config_dir(str(config_dir), version_base=None):
            return hydra_compose("config", overrides=list(overrides))
    except HydraException as err:
        raise ConfigError(f"{config_dir}: {err}") from None


def finalize(cfg: Config) -> Config:
    """Apply the documented environment override and read data.raw_dir from the repository
    (see `outside_the_workspace`)."""
    env_dir = os.environ.get(RAW_DIR_ENV)
    if env_dir:
        cfg.data.raw_dir = env_dir
    cfg.data.raw_dir = outside_the_workspace(cfg.data.raw_dir)  # validated as it is set
    return cfg


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
    return dataclasses.asdict(cfg)


def from_dict(raw: dict) -> Config:
    """Rebuild a Config saved by `to_dict` (checkpoints, sweep trials)."""
    return _to_config(raw, "saved config")
