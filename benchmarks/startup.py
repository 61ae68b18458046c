"""Start-up: what a process of each command pays in imports before its first step, on this
machine, recorded.

    python -m benchmarks.startup [--repeats 5] [--entries ...]   # measure here, record it
    python -m benchmarks.startup report [--update-docs]          # docs/test-suite.md's table

Every train stage, sweep worker and test that runs a stage is a new process, and each pays its
imports once. Lightning is the peer a training process cannot avoid; the commands that do not
train (evaluate, translate, export, the report) leave it out. Timed, each in a fresh
interpreter (`python -c`): `import torch`, `import lightning`, and the module behind the
train and the evaluate stage. Rounds are interleaved after a warm-up round (which also fills
the byte-code caches) and the median of each entry is recorded, with every sample, one JSON
file per run in benchmarks/results/startup/; the ratios to Lightning's import are what
carries from one machine to another.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

from benchmarks import machine_records
from pipeline import docs_blocks, environment

RESULTS = Path("benchmarks/results/startup")
PAGE = docs_blocks.DOCS / "test-suite.md"
BLOCK = "startup"
PEER = "lightning"
ENTRIES = {  # name: the statement a fresh interpreter runs
    "torch": "import torch",
    PEER: "import lightning",
    "train stage": "import pipeline.training.trainer",
    "evaluate stage": "import pipeline.evaluation.evaluate",
}


def start(statement: str) -> None:
    """`python -c statement` in a new process, from this repository."""
    subprocess.run([sys.executable, "-c", statement], cwd=environment.REPO_ROOT, check=True)


def measure(entries: list[str], repeats: int, warmup: int) -> dict[str, list[float]]:
    """{entry: seconds of each timed round}, the entries interleaved in every round."""
    # the benchmarks' timing loop; loaded here, so `report` starts without torch
    import torch

    from benchmarks.common import time_interleaved

    seconds = time_interleaved({name: partial(start, ENTRIES[name]) for name in entries},
                               repeats=repeats, warmup=warmup, device=torch.device("cpu"),
                               progress="start-up")  # fmt: skip
    return {name: [round(s, 3) for s in timed] for name, timed in seconds.items()}


def record(samples: dict[str, list[float]]) -> dict:
    return {
        "provenance": environment.provenance(),
        **machine_records.machine(),
        "median_s": {name: round(statistics.median(s), 3) for name, s in samples.items()},
        "samples_s": samples,
    }


# ---------------------------------------------------------------- the table


def row(entry: dict) -> list[str]:
    medians = entry["median_s"]
    peer = medians.get(PEER)

    def cell(name: str) -> str:
        if name not in medians:
            return "-"
        seconds = f"{medians[name]:.2f}"
        return seconds if name == PEER or not peer else f"{seconds} ({medians[name] / peer:.2f}x)"

    return [entry["provenance"]["commit"], machine_records.machine_label(entry),
            *map(cell, ENTRIES)]  # fmt: skip


HEADER = ["ran at", "machine class", *ENTRIES]


def block(entries: list[dict]) -> str:
    return machine_records.table(HEADER, row, entries)


def main(argv: list[str] | None = None) -> int:
    parser = machine_records.parser_with_report(__doc__.splitlines()[0], RESULTS, PAGE)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not timed")
    parser.add_argument("--entries", nargs="+", choices=list(ENTRIES), default=list(ENTRIES),
                        help="what to time (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "report":
        return machine_records.report(args, block, PAGE, BLOCK)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be at least 1 and --warmup at least 0")
    entry = record(measure(args.entries, args.repeats, args.warmup))
    print(block([entry]), end="")
    print(f"recorded {machine_records.write(args.results, entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
