"""A study spec's files: the YAML mapping of each, a spec that `extends` another read over it,
and a cheap first look at a spec's top-level keys (counted, not built)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError


def top_level_counts(path: Path) -> dict[str, Any] | None:
    """The spec's top-level keys from its YAML events, before any list is built (`_top_level`):
    a spec of 10**6 seeds is read in the seconds it takes to scan, not the minutes to build
    every item. None for a file that does not parse (the full reading says why)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        events = yaml.parse(path.read_text(encoding="utf-8"), Loader=loader)
        return _top_level(events)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _top_level(events: Iterator[yaml.Event]) -> dict[str, Any]:
    """Of a YAML document's top mapping: each key's scalar value (`settings`' too, as
    `settings.<key>`), or its number of items; nothing is constructed."""
    found: dict[str, Any] = {}
    for event in events:
        if isinstance(event, yaml.MappingStartEvent):
            break
        if not isinstance(event, (yaml.StreamStartEvent, yaml.DocumentStartEvent)):
            return found
    for name in events:
        if isinstance(name, yaml.MappingEndEvent) or not isinstance(name, yaml.ScalarEvent):
            return found
        value = next(events)
        if name.value == "settings" and isinstance(value, yaml.MappingStartEvent):
            found.update({f"settings.{k}": v for k, v in _top_level_pairs(events).items()})
        elif isinstance(value, yaml.ScalarEvent):
            found[name.value] = value.value
        else:
            found[name.value] = _items(events, value)
    return found


def _top_level_pairs(events: Iterator[yaml.Event]) -> dict[str, Any]:
    """The scalar entries of the mapping whose start was just read, to its end."""
    pairs: dict[str, Any] = {}
    for name in events:
        if isinstance(name, yaml.MappingEndEvent):
            return pairs
        _items(events, name)  # a key that is a collection: read past it
        value = next(events)
        if isinstance(name, yaml.ScalarEvent) and isinstance(value, yaml.ScalarEvent):
            pairs[name.value] = value.value
        else:
            _items(events, value)
    return pairs


def _items(events: Iterator[yaml.Event], start: yaml.Event) -> int:
    """How many items the node starting with `start` holds (a mapping: its keys), read to its
    end."""
    if not isinstance(start, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
        return 0
    end = (
        yaml.SequenceEndEvent
        if isinstance(start, yaml.SequenceStartEvent)
        else yaml.MappingEndEvent
    )
    count = 0
    for event in events:
        if isinstance(event, end):
            return count if end is yaml.SequenceEndEvent else count // 2
        _items(events, event)
        count += 1
    return count


def _read_mapping(path: Path, named_by: str) -> dict[str, Any]:
    """The YAML mapping in `path`; anything else is a ConfigError that says so without
    echoing the file's content (`named_by`: the spec and key that named the file, or "")."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{named_by}{path} is not a readable YAML file{line}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{named_by}{path} is not a study spec (a YAML mapping of keys)")
    return raw


def _parent_spec_path(path: Path, parent_name: Any) -> Path:
    """The spec that `path` extends: a relative path to a file in `path`'s folder or below
    (a spec that could name any file would read, and report on, files that are no specs)."""
    parent_path = path.parent / str(parent_name)
    folder = path.parent.resolve()
    if (
        not isinstance(parent_name, str)
        or Path(parent_name).is_absolute()
        or not parent_path.resolve().is_relative_to(folder)
    ):
        raise ConfigError(
            f"{path}: key 'extends': {parent_name!r} is not a spec in {path.parent} or below; "
            "name another study spec by its path relative to this one (e.g. table3.yaml)"
        )
    if not parent_path.is_file():
        raise ConfigError(f"{path}: extends: {parent_path} not found")
    return parent_path


def read_spec(path: Path, extended_by: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The spec's keys, over those of the spec it `extends` (a path beside it or below), if
    any. There, `variants` may be a list: those of the parent's variants (and their `paper`
    entries) to run again, e.g. a re-run of some rows under another measure, in a study of its
    own."""
    raw = _read_mapping(path, f"{extended_by[-1]}: key 'extends': " if extended_by else "")
    parent_name = raw.pop("extends", None)
    if parent_name is None:
        if isinstance(raw.get("variants"), list):
            raise ConfigError(f"{path}: key 'variants': a list of names is for a spec that "
                              "'extends' another; give a mapping {name: overrides}")  # fmt: skip
        return raw
    parent_path = _parent_spec_path(path, parent_name)
    chain = (*extended_by, path)
    if parent_path.resolve() in {p.resolve() for p in chain}:
        raise ConfigError(f"{path}: key 'extends': {parent_path} extends this spec in turn")
    parent = read_spec(parent_path, chain)
    if raw.get("study", parent.get("study")) == parent.get("study"):
        raise ConfigError(
            f"{path}: key 'study' must name a study of its own, not {parent_path}'s "
            f"'{parent.get('study')}' (the two would share one storage)"
        )
    selected = raw.get("variants")
    if isinstance(selected, list):
        parent_variants = parent.get("variants") or {}
        unknown = [name for name in selected if name not in parent_variants]
        if unknown:
            raise ConfigError(
                f"{path}: variants {unknown} are not variants of {parent_path} "
                f"({sorted(parent_variants)})"
            )
        raw["variants"] = {name: parent_variants[name] for name in selected}
        paper = parent.get("paper") or {}
        raw.setdefault("paper", {name: paper[name] for name in selected if name in paper})
    return {**parent, **raw}
