"""The test suite's result and time on this machine, recorded: a fresh clone's `bash .ci/run`.

    python -m benchmarks.ci_run                          # clone HEAD, run it, record it
    python -m benchmarks.ci_run report [--update-docs]   # docs/test-suite.md's table of the records

`bash .ci/run` is what CI runs: a fresh environment (`make setup`), `make lint`, then the
README's test command. A CI machine's CPU class is chance and the suite's time depends on it, so
docs/test-suite.md lists the runs from these records (benchmarks/results/ci/, one JSON file per
run): the commit, lock and machine (CPU family and model), the tests' outcomes, pytest's time
and the whole run's, its processes' CPU seconds (were the cores kept busy?), the pytest workers
(`--test-workers N` sets the Makefile's `TEST_WORKERS`), the slowest tests, and each test
file's tests and seconds, from the JUnit XML report the run is asked for through
`PYTEST_ADDOPTS` (`<clone>.junit.xml` beside the log): where the suite's time goes.

The clone goes into a new folder beside the repository (`--clone-into`), where CI has it: the
corpus is read from `../shared` next to it. Its output is shown as it comes and kept in
`<clone>.log`; the clone is removed after the run unless `--keep`. Exit status: the run's own
(a failed run is recorded too), or 2 when nothing could be run.
"""

from __future__ import annotations

import datetime
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

from benchmarks import machine_records
from pipeline import docs_blocks, environment

RESULTS = Path("benchmarks/results/ci")
PAGE = docs_blocks.DOCS / "test-suite.md"
BLOCK = "ci"
CI_SCRIPT = Path(".ci/run")
SHARED = "shared"  # CI's layout: the corpus and peers in ../shared beside the clone
OUTCOMES = ("passed", "failed", "errors", "skipped")  # the counts a record keeps, in this order
# pytest's last line: '1057 passed, 5 skipped, 14 warnings in 1098.46s (0:18:18)', with or
# without '=' around it (-q or not).
SUMMARY_LINE = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in ([\d.]+)s\b")
COUNT = re.compile(r"(\d+) (\w+)")
# pytest's `--durations` section: a header, then '194.12s setup    tests/test_x.py::test_y'.
DURATIONS_HEADER = re.compile(r"slowest (\d+ )?durations")
DURATION_LINE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")
SLOWEST_SHOWN = 8  # rows of the docs' table of the latest run's slowest tests
FILES_SHOWN = 8  # rows of its table of the latest run's costliest test files
WORKERS_DEFAULT = re.compile(r"^TEST_WORKERS \?= *(\d+)\s*$", re.MULTILINE)  # the Makefile's


def slowest_tests(output: str) -> list[dict]:
    """[{'seconds', 'phase', 'test'}] from pytest's last `--durations` section in `output`, the
    slowest first ([] where it printed none): where the suite's time goes."""
    lines = output.splitlines()
    headers = [i for i, line in enumerate(lines) if DURATIONS_HEADER.search(line)]
    if not headers:
        return []
    found = []
    for line in lines[headers[-1] + 1 :]:
        if not (m := DURATION_LINE.match(line.strip())):
            break
        found.append({"seconds": float(m[1]), "phase": m[2], "test": m[3]})
    return sorted(found, key=lambda d: -d["seconds"])


def file_of_case(classname: str, root: Path) -> str:
    """The test file under `root` that a JUnit test case's class name ('tests.lab.test_x', or
    'tests.test_x.TestY' for a class) comes from (the name itself where none is found)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (root / path).is_file():
            return path
    return classname


def junit_report(clone: Path) -> Path:
    """Where a run of `clone` has pytest write its JUnit XML report: beside the clone's log."""
    return clone.with_name(clone.name + ".junit.xml")


def time_by_file(junit: Path, root: Path) -> list[dict] | None:
    """[{'file', 'tests', 'seconds'}] from pytest's JUnit XML report: each test file's tests
    and their seconds in all (set-up, call and tear-down, every pytest worker's added up), the
    costliest first; None where there is no readable report."""
    try:
        cases = list(ElementTree.parse(junit).iter("testcase"))
    except (OSError, ElementTree.ParseError):
        return None
    tests, seconds = Counter(), Counter()
    for case in cases:
        tests[name := file_of_case(case.get("classname", ""), root)] += 1
        seconds[name] += float(case.get("time") or 0)
    return [
        {"file": f, "tests": tests[f], "seconds": round(s, 2)} for f, s in seconds.most_common()
    ]


def children_cpu_s() -> float:
    """CPU seconds (user and system) used so far by this process's children that have ended,
    with the descendants each waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CannotRun(Exception):
    """Nothing was run (exit 2): the message names what is missing or in the way."""


def pytest_summary(output: str) -> dict | None:
    """{'tests': {outcome: count}, 'pytest_s': seconds} from pytest's last summary line in
    `output`, or None where pytest never finished (set-up or lint failed, a kill)."""
    found = [m for line in output.splitlines() if (m := SUMMARY_LINE.match(line.strip()))]
    if not found:
        return None
    counts, seconds = found[-1].groups()
    named = {word if word != "error" else "errors": int(n) for n, word in COUNT.findall(counts)}
    return {
        "tests": {outcome: named.get(outcome, 0) for outcome in OUTCOMES},
        "pytest_s": float(seconds),
    }


def clean_environment(workers: int | None = None, junit: Path | None = None) -> dict[str, str]:
    """This process's environment as CI's would be: CI=true, and no virtual environment of
    ours on PATH (the clone makes and uses its own); TEST_WORKERS where a count is given;
    pytest asked for a JUnit XML report at `junit`, where given (it changes no outcome)."""
    env = dict(os.environ, CI="true")
    if workers is not None:
        env["TEST_WORKERS"] = str(workers)
    if junit is not None:
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={junit}".strip()
    venv = env.pop("VIRTUAL_ENV", None)
    own_bin = str(Path(sys.prefix) / "bin")
    drop = {own_bin} | ({str(Path(venv) / "bin")} if venv else set())
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in drop)
    return env


def check_before_cloning(repo: Path, clone: Path) -> None:
    if not (repo / CI_SCRIPT).is_file():
        raise CannotRun(f"{repo / CI_SCRIPT}: no CI script in {repo}")
    if clone.exists():
        raise CannotRun(f"{clone}: exists; name a new folder with --clone-into")
    shared = clone.parent / SHARED
    if not shared.is_dir():
        raise CannotRun(f"{shared}: no such folder; CI reads the corpus from ../{SHARED} beside "
                        "the clone, so clone into a folder next to it (--clone-into)")  # fmt: skip


def pytest_workers(clone: Path, env: dict[str, str]) -> int | None:
    """The pytest workers a run of the clone's `make test` gets: TEST_WORKERS from `env`, else
    the clone's Makefile default (None where it has neither)."""
    if env.get("TEST_WORKERS", "").isdigit():
        return int(env["TEST_WORKERS"])
    makefile = clone / "Makefile"
    found = makefile.is_file() and WORKERS_DEFAULT.search(makefile.read_text())
    return int(found[1]) if found else None


def run_ci(clone: Path, log: Path, env: dict[str, str]) -> tuple[int, float, float, str]:
    """(exit status, wall seconds, CPU seconds, output) of `bash .ci/run` in `clone`; each line
    is shown as it comes and written to `log`. The CPU seconds are those of the processes the
    run waited for (a daemon left running after it is not counted)."""
    started, cpu_before = time.monotonic(), children_cpu_s()
    lines = []
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            ["bash", str(CI_SCRIPT)], cwd=clone, env=env, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        for line in process.stdout:
            sys.stdout.write(line)
            sink.write(line)
            lines.append(line)
        code = process.wait()
    return code, time.monotonic() - started, children_cpu_s() - cpu_before, "".join(lines)


def record(
    clone: Path, code: int, total_s: float, cpu_s: float, output: str, workers: int | None
) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    summary = pytest_summary(output)
    return {
        "provenance": {
            "commit": commit,
            "environment_lock": environment.lock_hash(clone / environment.LOCK_FILE.name),
            "hardware": environment.hardware(),
        },
        **machine_records.machine(),
        "exit_code": code,
        "total_s": round(total_s, 1),
        "cpu_s": round(cpu_s, 1),
        "cores": os.cpu_count(),
        "test_workers": workers,
        **(summary or {"tests": None, "pytest_s": None}),
        "slowest": slowest_tests(output),
        # a run that never finished pytest may have left a nested test's report, not its own
        "by_file": time_by_file(junit_report(clone), clone) if summary else None,
    }


def run_and_record(
    repo: Path, clone: Path, results: Path, keep: bool, workers: int | None = None
) -> tuple[int, Path]:
    check_before_cloning(repo, clone)
    subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True)
    env = clean_environment(workers, junit_report(clone))
    try:
        code, total_s, cpu_s, output = run_ci(clone, clone.with_name(clone.name + ".log"), env)
        entry = record(clone, code, total_s, cpu_s, output, pytest_workers(clone, env))
    finally:
        if not keep:
            shutil.rmtree(clone)
    return code, machine_records.write(results, entry)


# ---------------------------------------------------------------- the table


def row(entry: dict) -> list[str]:
    tests = entry["tests"]
    counted = ", ".join(f"{tests[o]} {o}" for o in OUTCOMES if tests and tests[o]) or "none ran"
    pytest_min = "-" if entry["pytest_s"] is None else f"{entry['pytest_s'] / 60:.1f}"
    return [
        entry["finished"][:10],
        entry["provenance"]["commit"],
        machine_records.machine_label(entry),
        "passed" if entry["exit_code"] == 0 else f"failed (exit {entry['exit_code']})",
        counted,
        f"{pytest_min} / {entry['total_s'] / 60:.1f} min",
        str(entry.get("test_workers") or "-"),
        cores_busy(entry),
    ]


def cores_busy(entry: dict) -> str:
    """The share of the machine's cores the run kept busy, from its CPU seconds ('-' for a
    record made before they were kept, or of a run too short to time): under 100% is time a
    core waited."""
    if entry.get("cpu_s") is None or not entry["total_s"]:
        return "-"
    return f"{entry['cpu_s'] / (entry['total_s'] * entry['cores']):.0%}"


HEADER = ["date", "ran at", "machine class", "result", "tests", "pytest / in all", "workers",
          "cores busy"]  # fmt: skip
SLOWEST_HEADER = ["seconds", "phase", "test"]
BY_FILE_HEADER = ["test file", "tests", "seconds", "share"]


def latest_table(entries: list[dict], key: str, header: list[str], rows, text) -> str:
    """A table of `rows(found)` for the latest run whose record holds `key` (none: ''), after
    `text(run, found)`, which names the run."""
    if not (latest := [e for e in entries if e.get(key)]):
        return ""
    entry = latest[-1]
    run = (f"{entry['finished'][:10]}, {entry['provenance']['commit']}, "
           f"{machine_records.machine_label(entry)}")  # fmt: skip
    return f"\n{text(run, entry[key])}:\n\n" + docs_blocks.markdown_table(header, rows(entry[key]))


def slowest_table(entries: list[dict]) -> str:
    return latest_table(
        entries, "slowest", SLOWEST_HEADER,
        lambda found: [[f"{d['seconds']:.0f}", d["phase"], f"`{d['test']}`"]
                       for d in found[:SLOWEST_SHOWN]],
        lambda run, _: f"Where the time goes: the slowest tests of the latest recorded run "
                       f"({run}), a fixture's build in its first test's set-up",
    )  # fmt: skip


def by_file_table(entries: list[dict]) -> str:
    def total(found: list[dict]) -> float:
        return sum(d["seconds"] for d in found) or 1.0

    return latest_table(
        entries, "by_file", BY_FILE_HEADER,
        lambda found: [[f"`{d['file']}`", str(d["tests"]), f"{d['seconds']:.0f}",
                        f"{d['seconds'] / total(found):.0%}"] for d in found[:FILES_SHOWN]],
        lambda run, found: f"By test file, in the latest run that recorded it ({run}): each "
                           f"file's seconds, set-ups included, added up over the pytest workers, "
                           f"and its share of the {total(found):.0f} s of all {len(found)} files",
    )  # fmt: skip


def block(entries: list[dict]) -> str:
    tables = machine_records.table(HEADER, row, entries)
    return tables + slowest_table(entries) + by_file_table(entries)


def main(argv: list[str] | None = None) -> int:
    parser = machine_records.parser_with_report(__doc__.splitlines()[0], RESULTS, PAGE)
    parser.add_argument("--repo", type=Path, default=environment.REPO_ROOT,
                        help="the repository whose HEAD is cloned and run")  # fmt: skip
    parser.add_argument("--clone-into", type=Path, default=None,
                        help="a new folder beside ../shared (default: ci-<date> beside --repo)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the clone after the run")
    parser.add_argument("--test-workers", type=int, default=None, metavar="N",
                        help="pytest workers (TEST_WORKERS; default: the Makefile's)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.test_workers is not None and args.test_workers < 1:
        parser.error(f"--test-workers {args.test_workers}: at least 1")
    if args.command == "report":
        return machine_records.report(args, block, PAGE, BLOCK)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    clone = (args.clone_into or args.repo.resolve().parent / f"ci-{stamp}").resolve()
    try:
        code, path = run_and_record(args.repo.resolve(), clone, args.results, args.keep,
                                    args.test_workers)  # fmt: skip
    except CannotRun as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"recorded {path} (exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
