"""benchmarks/sweep_claims.py's recorded runs: the table of docs/sweeps-at-scale.md is theirs, and
they meet the scaling target (a trial's coordinator time at 5,000 waiting points within 2x of
that at 100, for the same number of workers; about one connection a worker at 32 workers)."""

from __future__ import annotations

import json

from tests.conftest import REPO_ROOT

RECORDS = REPO_ROOT / "benchmarks" / "results" / "sweep_claims"
PAGE = REPO_ROOT / "docs" / "sweeps-at-scale.md"
SMALL, LARGE = 100, 5000
TARGET_RATIO = 2.0


def shown_rows() -> list[dict]:
    """The page's rows: the 100-point rows of the second run (the first one's were measured on a
    busier machine), the others of the first."""
    first = json.loads((RECORDS / "points-100-500-5000.json").read_text())["rows"]
    again = json.loads((RECORDS / "points-100-again.json").read_text())["rows"]
    return again + [row for row in first if row["points"] != SMALL]


def table_line(r: dict) -> str:
    return (f"| {r['workers']} | {r['points']:,} ({r['waiting_at_start']:,}) | "
            f"{r['claims_per_s']:.1f} | {r['coordinator_ms_median']:,.0f} "
            f"({r['coordinator_ms_p95']:,.0f}) | {r['coordinator_cpu_ms_median']:.0f} | "
            f"{r['claim_queries_per_claim']:.2f} | {r['connections_max']} "
            f"({r['connections_median']:g}) |")  # fmt: skip


def test_the_pages_table_is_the_recorded_runs():
    page = PAGE.read_text(encoding="utf-8")
    for row in shown_rows():
        assert table_line(row) in page, table_line(row)


def test_the_recorded_runs_meet_the_scaling_target():
    rows = {(r["points"], r["workers"]): r for r in shown_rows()}
    compared = [n for (points, n) in rows if points == SMALL and (LARGE, n) in rows]
    assert compared
    for n in compared:
        small, large = rows[SMALL, n], rows[LARGE, n]
        for key in ("coordinator_ms_median", "coordinator_cpu_ms_median"):
            assert large[key] <= TARGET_RATIO * small[key], (n, key)
    most = max(n for (_, n) in rows)
    # one connection a worker between trials; a heartbeat's query may add one for a moment
    for (_, n), row in rows.items():
        if n == most:
            assert row["connections_median"] <= n and row["connections_max"] <= 2 * n
