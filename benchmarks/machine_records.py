"""Runs recorded one JSON file per run and machine, for tables that grow with every CPU class a
run lands on (the CI times, the start-up times): the machine's class, its CPU family and model
and when the run finished, the file's name from them, and the table's machine column."""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from pathlib import Path

from pipeline import docs_blocks, environment


def machine() -> dict:
    """What a record keeps about this machine and when the run finished."""
    cpu = environment.cpuinfo()
    return {
        "cpu": {"family": cpu.get("cpu family"), "model": cpu.get("model")},
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def record_name(entry: dict, run: int = 1) -> str:
    """'<date>.<commit>.family<F>-model<M>.json': one file per run; the `run`-th run of one day,
    commit and class (two settings compared on one machine) adds '.<run>' before '.json'."""
    cpu = entry["cpu"]
    again = f".{run}" if run > 1 else ""
    return (f"{entry['finished'][:10]}.{entry['provenance']['commit']}"
            f".family{cpu['family']}-model{cpu['model']}{again}.json")  # fmt: skip


def write(results: Path, entry: dict) -> Path:
    """`entry` as a new file in `results`: never over an earlier run's record."""
    results.mkdir(parents=True, exist_ok=True)
    run = 1
    while True:
        path = results / record_name(entry, run)
        try:
            with path.open("x", encoding="utf-8") as sink:  # "x": fails where the file exists
                sink.write(json.dumps(entry, indent=2) + "\n")
            return path
        except FileExistsError:
            run += 1


def run_number(path: Path) -> int:
    """The `run` `record_name` gave a record's file: 1, or the number before '.json'."""
    last = path.name.removesuffix(".json").rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else 1


def load(results: Path) -> list[dict]:
    """The records in `results`, in the order their runs finished (within one second, in the
    order they were written)."""
    records = [(json.loads(p.read_text(encoding="utf-8")), run_number(p))
               for p in sorted(results.glob("*.json"))]  # fmt: skip
    return [entry for entry, _ in sorted(records, key=lambda r: (r[0]["finished"], r[1]))]


def machine_label(entry: dict) -> str:
    """'AMD EPYC, avx512_bf16 (family 25, model 17)'; a CPU without bf16 kernels is named so,
    since it trains in float32, which its times show."""
    name = environment.hardware_class(entry["provenance"]["hardware"])
    if not any(flag in name for flag in environment.CPU_BF16_FLAGS):
        name += ", no bf16"
    cpu = entry["cpu"]
    return f"{name} (family {cpu['family']}, model {cpu['model']})"


# ---------------------------------------------------------------- the command line and table


def parser_with_report(description: str, results: Path, page: Path) -> argparse.ArgumentParser:
    """A recording benchmark's command line: `--results` (the records' folder) and a `report`
    command printing their table (`--update-docs` writes it into `page`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--results", type=Path, default=results, help="the records' folder")
    commands = parser.add_subparsers(dest="command")
    report = commands.add_parser("report", help=f"the records as the table of {page}")
    # also after `report`; SUPPRESS keeps a --results given before it
    report.add_argument("--results", type=Path, default=argparse.SUPPRESS, help="as above")
    docs_blocks.add_update_argument(report, str(page))
    return parser


def table(header: list[str], row: Callable[[dict], list[str]], entries: list[dict]) -> str:
    if not entries:
        return "No run recorded yet.\n"
    return docs_blocks.markdown_table(header, [row(e) for e in entries])


def report(args: argparse.Namespace, block: Callable[[list[dict]], str], page: Path,
           name: str) -> int:  # fmt: skip
    """`report`: the table of the records in args.results, printed and, with --update-docs,
    written into block `name` of `page`."""
    text = block(load(args.results))
    if args.update_docs is not None:
        docs_blocks.fill(args.update_docs / page, name, text)
    print(text, end="")
    return 0
