"""The schema (`pipeline.config_schema`) for readers: the JSON Schema of params.yaml
(conf/params.schema.json, named at the top of params.yaml so that an editor with a YAML
language server completes and checks it) and the reference table of docs/configuration-keys.md
(its `config` block, `pipeline.docs_blocks`); a test checks that both match the schema.

    python -m pipeline.config_reference --update-docs    (rewrite both)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline import docs_blocks
from pipeline.config import SCHEMA_FILE, describe, json_schema, resolve
from pipeline.config_schema import defaults

PAGE = docs_blocks.DOCS / "configuration-keys.md"
BLOCK = "config"


def leaves(
    schema: dict | None = None, prefix: str = "", root: dict | None = None
) -> list[tuple[str, dict]]:
    """(dotted key, schema) of every key of params.yaml (or of `root`, another file's
    schema), in the file's order."""
    found = []
    for name, sub in resolve(schema or root or json_schema(), root).get("properties", {}).items():
        dotted = f"{prefix}.{name}".lstrip(".")
        if "$ref" in sub:
            found += leaves(sub, dotted, root)
        else:
            found.append((dotted, sub))
    return found


def _type_text(schema: dict) -> str:
    schema = resolve(schema)
    branches = [resolve(b) for b in schema.get("anyOf", [])] or [schema]
    kinds = [b.get("type") or "string" for b in branches]
    return " or ".join(dict.fromkeys(kinds))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_table() -> str:
    """The Markdown table of every key: type, values, default and meaning."""
    declared = defaults()
    rows = []
    for dotted, schema in leaves():
        value: Any = declared
        for part in dotted.split("."):
            value = value[part]
        rows.append([f"`{dotted}`", _type_text(schema), _cell(describe(schema)),
                     f"`{_cell(json.dumps(value))}`", _cell(schema.get("description", ""))])  # fmt: skip
    return docs_blocks.markdown_table(["key", "type", "values", "default", "meaning"], rows)


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


def update_docs(root: Path) -> None:
    """Write conf/params.schema.json and docs/configuration-keys.md's `config` block under `root`."""
    (root / SCHEMA_FILE.relative_to(SCHEMA_FILE.parent.parent)).write_text(
        schema_text(), encoding="utf-8"
    )
    docs_blocks.fill(root / PAGE, BLOCK, reference_table())


def cli(argv: list[str] | None = None) -> None:
    from pipeline.cli import parser

    cli_parser = parser("pipeline.config_reference", __doc__)
    docs_blocks.add_update_argument(cli_parser, f"{SCHEMA_FILE.name} and {PAGE}")
    args = cli_parser.parse_args(argv)
    if args.update_docs is None:
        print(schema_text(), end="")
        return
    update_docs(args.update_docs)


if __name__ == "__main__":
    from pipeline.cli import main

    main(cli)
