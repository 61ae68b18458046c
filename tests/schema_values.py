"""Values inside and outside a key's domain, read from the JSON Schema pydantic derives from a
schema's classes (`pipeline.config.json_schema`, `pipeline.sweep.spec_schema.json_schema`): made
and checked here by JSON Schema's rules, apart from pydantic, so that a test of its refusals
does not ask it. A `$ref` is read in params.yaml's schema (no key of a study spec holds one)."""

from __future__ import annotations

import math
import re

from hypothesis import strategies as st

from pipeline import config as config_lib


def _branches(schema: dict) -> list[dict]:
    schema = config_lib.resolve(schema)
    return [config_lib.resolve(b) for b in schema.get("anyOf", [])] or [schema]


def _entry_schema(schema: dict) -> dict:
    """The schema of an object's entries: `additionalProperties`, else its one
    `patternProperties` value, else any value ({})."""
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    return next(iter(schema.get("patternProperties", {}).values()), {})


def accepts(schema: dict, value) -> bool:
    """Whether `value` is inside `schema` (the keywords pydantic writes), by JSON Schema's
    rules: read apart from pydantic, so that a test of its refusals does not ask it."""
    return any(_accepts_branch(branch, value) for branch in _branches(schema))


def _accepts_branch(s: dict, value) -> bool:  # noqa: C901 (one rule a keyword)
    kind = s.get("type")
    if "enum" in s or "const" in s:
        return any(type(value) is type(c) and value == c for c in s.get("enum", [s.get("const")]))
    checks = {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }  # fmt: skip
    if not checks.get(kind, True):
        return False
    if kind in ("integer", "number"):
        return not (value < s.get("minimum", -math.inf) or value > s.get("maximum", math.inf)
                    or value <= s.get("exclusiveMinimum", -math.inf)
                    or value >= s.get("exclusiveMaximum", math.inf))  # fmt: skip
    if kind == "string":
        return len(value) >= s.get("minLength", 0) and (
            "pattern" not in s or re.search(s["pattern"], value) is not None)  # fmt: skip
    if kind == "array":
        return (s.get("minItems", 0) <= len(value) <= s.get("maxItems", math.inf)
                and all(accepts(s.get("items", {}), item) for item in value))  # fmt: skip
    if kind == "object":
        keys = s.get("propertyNames") or ({"type": "string", "pattern": next(iter(
            s["patternProperties"]))} if s.get("patternProperties") else {"type": "string"})  # fmt: skip
        entry = _entry_schema(s)
        return all(accepts(keys, name) and accepts(entry, item) for name, item in value.items())
    return True


def an_inside_value(schema: dict):
    """One value `schema` accepts (an item or entry beside a bad one)."""
    for candidate in ("a", "a" * 64, "a.a.gz", "src", 1, 1.0, 0, True, [], {}, None):
        if accepts(schema, candidate):
            return candidate
    for branch in _branches(schema):
        if branch.get("type") == "array" and branch.get("minItems"):  # [a, b]
            return [an_inside_value(branch.get("items", {}))] * branch["minItems"]
    raise AssertionError(f"no example value for {schema}")


def outside(schema: dict):
    """A hypothesis strategy of values `schema` refuses, of every class its domain has: the
    wrong type, below its minimum, above its maximum, not one of its choices, not matching its
    pattern, empty, of the wrong length, holding a bad item, key or entry. Only values that
    YAML and OmegaConf keep as they are (no number written as a string)."""

    words = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=10)
    classes = [words, st.just(1.5), st.just(7), st.just(True), st.just([1, 2]), st.just({"a": 1}),
               st.just(math.inf), st.just(math.nan), st.just(-3)]  # fmt: skip
    for branch in _branches(schema):
        kind = branch.get("type")
        if kind in ("integer", "number"):
            number = st.integers if kind == "integer" else (
                lambda **bound: st.floats(allow_nan=False, allow_infinity=False, **bound))  # fmt: skip
            for low in ("minimum", "exclusiveMinimum"):
                if low in branch:
                    classes.append(number(max_value=math.ceil(branch[low]) - 1 if kind ==
                                          "integer" else branch[low]))  # fmt: skip
            for high in ("maximum", "exclusiveMaximum"):
                if high in branch:
                    classes.append(number(min_value=math.floor(branch[high]) + 1 if kind ==
                                          "integer" else branch[high]))  # fmt: skip
        if kind == "string":
            classes += [st.just(""), st.sampled_from(["a/b", "two words", "new\nline", "-dash",
                                                      "x" * 300])]  # fmt: skip
        if kind == "array":
            classes += [st.just([]), st.lists(st.just(0.5), max_size=4)]
            if branch.get("items"):  # items of any value have no bad one
                good = an_inside_value(branch["items"])
                classes.append(outside(branch["items"]).map(lambda bad, g=good: [g, bad]))
        if kind == "object":
            entry = _entry_schema(branch)
            good = an_inside_value(entry)
            classes += [st.just({"a/b": good}), st.just({"zz": good})]
            if entry:  # entries of any value have no bad one
                classes.append(outside(entry).map(lambda bad: {"src": bad}))
    return st.one_of(classes).filter(lambda value: not accepts(schema, value))
