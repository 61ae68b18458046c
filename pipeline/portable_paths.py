"""Paths in records and checkpoints are relative to the repository or to the work root, never
absolute paths of one machine's home directory.

    python -m pipeline.portable_paths --relativize                 # every tracked record
    python -m pipeline.portable_paths --relativize ablations/results/table3_seeds

A path under the sweeps' work root (`$XDG_CACHE_HOME/transformer-ablations` of any user:
`/root/.cache/transformer-ablations/...`, `/home/<user>/.cache/transformer-ablations/...`) is
written `<work-root>/...`; a path in the repository, relative to it; any other path in a home
directory, `~/...`. `--relativize` rewrites files written before this rule (or by code that
predates it) in place: text records (JSON, YAML, JSON lines, Markdown, text) and Optuna's
SQLite storages (`study.db`: the user and system attributes of studies and trials, in one
transaction, then vacuumed so that no old value stays in a free page). In a record it also
rewrites every other absolute path: a study's folders on the machine that ran it (its
`--work-dir`, a temporary folder, as `<work-root>/<study>/...`; its `--results-dir`, as the
study's results folder in the repository), and anything else relative to the repository
(`../other-checkout/...`, `../../tmp/...`). Rewriting is idempotent.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.atomic import write_text_atomic
from pipeline.cli import main, parser
from pipeline.errors import DataError

WORK_ROOT_MARK = "<work-root>"
HOME_MARK = "~"
WORK_ROOT_NAME = "transformer-ablations"
# The sweeps' work root: trials' checkpoints and other bulky outputs, outside the repository.
WORK_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / WORK_ROOT_NAME
# The folders holding committed records (what --relativize and the test read).
RECORD_ROOTS = ("ablations/results", "results", "metrics", "benchmarks/results")
TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".tsv", ".csv", ".lock")
DATABASE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
# Optuna's tables of JSON values that may hold paths (user attributes such as checkpoint_dir).
ATTRIBUTE_TABLES = ("study_user_attributes", "study_system_attributes",
                    "trial_user_attributes", "trial_system_attributes")  # fmt: skip

_HOME = r"(?<![\w./~-])(?:/root|/home/[^/\s\"',:;]+)"
HOME_PATH = re.compile(_HOME + r"(?=/|\b)")  # an absolute path in someone's home
_WORK = re.compile(_HOME + r"/\.cache/" + re.escape(WORK_ROOT_NAME) + r"(?![\w.-])")


def relativize(text: str, repo: Path | None = None, work_root: Path | None = None) -> str:
    """`text` with every absolute path under a work root, the repository `repo` or a home
    directory written portably (see the module's doc); `work_root`: this machine's, when it
    lies elsewhere (XDG_CACHE_HOME, a test's folder)."""
    if work_root is not None:
        text = _replace_prefix(text, str(Path(work_root)), WORK_ROOT_MARK)
    text = _WORK.sub(WORK_ROOT_MARK, text)
    if repo is not None:
        text = re.sub(_START + re.escape(str(Path(repo))) + "/", "", text)  # relative to it
        text = _replace_prefix(text, str(Path(repo)), ".")
    return HOME_PATH.sub(HOME_MARK, text)


_START = r"(?<![\w./~-])"  # a path starts here, not within another one


def relativize_tree(value: Any, repo: Path | None = None, work_root: Path | None = None) -> Any:
    """A tree of dicts, lists and scalars (a checkpoint's saved config) with every string
    written portably by `relativize`; the tree itself is left as it was."""
    if isinstance(value, str):
        return relativize(value, repo, work_root)
    if isinstance(value, dict):
        return {key: relativize_tree(item, repo, work_root) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(relativize_tree(item, repo, work_root) for item in value)
    return value


def _replace_prefix(text: str, prefix: str, mark: str) -> str:
    """`prefix` where it is a whole path or a path's leading folders, replaced by `mark`."""
    return re.sub(_START + re.escape(prefix) + r"(?=/|$|[\s\"',:;)\]}])", lambda _: mark, text)


def copy_relativized(
    source: Path, target: Path, repo: Path | None = None, work_root: Path | None = None
) -> None:
    """A text record copied with its paths written portably (atomically)."""
    write_text_atomic(target, relativize(source.read_text(encoding="utf-8"), repo, work_root))


def home_paths(text: str) -> list[str]:
    """The absolute home paths in `text`."""
    return [match.group(0) for match in re.finditer(_HOME + r"/[^\s\"',;)\]}]*", text)]


# An absolute path of two names or more (a lone `/name` is as often a unit or a ratio).
# Not after a mark (`<work-root>/...`, `<run>/...`): that path is relative to it.
ABSOLUTE_PATH = re.compile(r"(?<![\w./~>-])/[\w.@+-]+(?:/[\w.@+-]+)+/?")
# The folders a sweep's --work-dir holds for a study: its points' and its shared data.
_WORK_FOLDER = re.compile(r"^(?:data|.+-seed\d+)$")
STUDY_RESULTS = Path("ablations/results")  # a study's records: <this>/<study>/


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in `text` (what a record must not hold)."""
    return ABSOLUTE_PATH.findall(text)


def portable_record(text: str, record: Path, repo: Path, work_root: Path | None = None) -> str:
    """`relativize`, then every absolute path left: a study's folders on the machine that ran
    it, in a record of that study (`record`, under STUDY_RESULTS), as the work root's or the
    repository's; any other, relative to the repository."""
    text = relativize(text, repo, work_root)
    record = record.resolve()
    inside = record.relative_to(repo).parts if record.is_relative_to(repo) else ()
    n = len(STUDY_RESULTS.parts)
    study = inside[n] if inside[:n] == STUDY_RESULTS.parts and len(inside) > n + 1 else None

    def portable(match: re.Match) -> str:
        path = match.group(0)
        folders = path.rstrip("/").split("/")
        if study in folders[:-1]:
            at = folders.index(study)
            rest = "/".join(folders[at + 1 :])
            if _WORK_FOLDER.match(folders[at + 1]):
                return f"{WORK_ROOT_MARK}/{study}/{rest}"
            return f"{STUDY_RESULTS.as_posix()}/{study}/{rest}"
        return os.path.relpath(path, repo) + ("/" if path.endswith("/") else "")

    return ABSOLUTE_PATH.sub(portable, text)


def tracked_records(repo: Path, roots: Iterable[str] = RECORD_ROOTS) -> list[Path]:
    """The files git tracks under `roots` of `repo` that hold records (text or SQLite)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", *roots], cwd=repo,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [repo / name for name in listed.split("\0")
            if name and name.endswith(TEXT_SUFFIXES + DATABASE_SUFFIXES)]  # fmt: skip


def _files(paths: Iterable[Path]) -> list[Path]:
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file()
                            and p.name.endswith(TEXT_SUFFIXES + DATABASE_SUFFIXES))  # fmt: skip
        elif path.is_file():
            found.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return found


def relativize_file(path: Path, repo: Path | None = None, work_root: Path | None = None) -> bool:
    """Rewrite one record in place; whether it changed."""
    if path.name.endswith(DATABASE_SUFFIXES):
        return relativize_database(path, repo, work_root)
    text = path.read_text(encoding="utf-8")
    new = (
        portable_record(text, path, repo, work_root) if repo else relativize(text, repo, work_root)
    )
    if new != text:
        write_text_atomic(path, new)
    return new != text


def relativize_database(
    path: Path, repo: Path | None = None, work_root: Path | None = None
) -> bool:
    """The attribute values of an Optuna SQLite storage, rewritten in one transaction."""
    changed = 0
    with sqlite3.connect(path, timeout=60) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in (t for t in ATTRIBUTE_TABLES if t in tables):
            rows = db.execute(f"SELECT rowid, value_json FROM {table}").fetchall()
            for rowid, value in rows:
                if not value:
                    continue
                new = (
                    portable_record(value, path, repo, work_root)
                    if repo
                    else relativize(value, repo, work_root)
                )
                if new != value:
                    db.execute(f"UPDATE {table} SET value_json = ? WHERE rowid = ?", (new, rowid))
                    changed += 1
    if changed:
        with sqlite3.connect(path, timeout=60) as db:
            db.execute("VACUUM")  # no old value left in a free page
    return bool(changed)


def parse_args(argv: list[str] | None):
    cli = parser("pipeline.portable_paths", __doc__)
    cli.add_argument("--relativize", action="store_true", required=True,
                     help="rewrite absolute paths in the records in place")  # fmt: skip
    cli.add_argument("paths", nargs="*", type=Path,
                     help=f"files or folders (default: git's tracked records under "
                          f"{', '.join(RECORD_ROOTS)})")  # fmt: skip
    cli.add_argument("--repo", type=Path, default=Path("."), help="the repository (default: .)")
    return cli.parse_args(argv)


def cli(argv: list[str] | None = None) -> list[Path]:
    args = parse_args(argv)
    repo = args.repo.resolve()
    files = _files(args.paths) if args.paths else tracked_records(repo)
    rewritten = [path for path in files if relativize_file(path, repo, WORK_ROOT)]
    for path in rewritten:
        print(f"rewrote {path}")
    print(f"{len(rewritten)} of {len(files)} record(s) rewritten")
    return rewritten


if __name__ == "__main__":
    main(lambda: cli(sys.argv[1:]))
