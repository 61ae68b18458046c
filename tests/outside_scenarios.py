"""The reliability scenarios an outside tester ran, run as they ran them: real commands in a
fresh workspace, each with its real fault (a value `dvc exp run -S` writes into params.yaml
unchecked, an export over its own input, a gzip bomb, an endless line, a server that trickles,
study specs with bad values). Each must end with exit 2 and a message naming the key, file or
URL, with no traceback, and leave its workspace as it was.

    python tests/outside_scenarios.py        (one line per scenario; exit 1 if one failed)

The suite runs it (tests/test_outside_scenarios.py). The scenarios that need a trained run, a
signal or a full disk have tests of their own, listed on the reliability pages of docs/.
"""

from __future__ import annotations

import http.server
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from omegaconf import OmegaConf  # noqa: E402

from pipeline import config  # noqa: E402
from tests.conftest import GRID_SPEC, gzip_bomb, snapshot  # noqa: E402
from tests.test_download import TricklingHandler  # noqa: E402

CORPUS = Path(os.environ.get("MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))
COMMAND_TIMEOUT_S = 120  # far above any scenario's few seconds: a hang is a failure, not a wait


@dataclass
class Scenario:
    """`command` run in a fresh workspace that `setup` prepared (it returns extra environment
    variables); the run must exit `exit_code` with `message` on stderr."""

    name: str
    command: list[str]
    message: str
    setup: Callable[[Path], dict[str, str]] = lambda workspace: {}
    exit_code: int = 2
    files: dict[str, bytes] = field(default_factory=dict)  # written before `setup`


# ---- values `dvc exp run -S` writes into params.yaml, unchecked ------------------------------


def params_with(*overrides: str) -> Callable[[Path], dict[str, str]]:
    """A setup writing conf/ composed with `overrides` into params.yaml, as DVC does."""

    def setup(workspace: Path) -> dict[str, str]:
        text = OmegaConf.to_yaml(config.compose_dict(list(overrides)))
        (workspace / "params.yaml").write_text(text)
        return {}

    return setup


CHECK = [sys.executable, "-m", "pipeline.stages.check"]
BAD_VALUES = [
    ("seed=-1", "seed"),  # sentencepiece's TypeError in the tokenize stage
    (f"seed={2**70}", "seed"),
    ("train.log_every_n_steps=0", "train.log_every_n_steps"),  # ZeroDivisionError at step 1
    ("data.max_train_pairs=-5", "data.max_train_pairs"),  # trained on all but 5 pairs
    ("data.max_train_pairs=0", "data.max_train_pairs"),
    ("data.tokenizer.vocab_size=10000000", "data.tokenizer.vocab_size"),
    ("eval.heatmaps=-3", "eval.heatmaps"),
]
SCENARIOS = [
    Scenario(f"check refuses {override}", CHECK, f"error: config key '{key}': must be ",
             setup=params_with(override))
    for override, key in BAD_VALUES
]  # fmt: skip

# ---- a command that replaces a folder holding its own input ----------------------------------

CHECKPOINT, TOKENIZER = "models/train/checkpoints/last.ckpt", "data/tokenized/spm.model"
SCENARIOS.append(
    Scenario(
        "export --force refuses an --out folder holding its --checkpoint",
        [
            sys.executable,
            "-m",
            "pipeline.export",
            "--checkpoint",
            CHECKPOINT,
            "--tokenizer",
            TOKENIZER,
            "--out",
            "models",
            "--force",
        ],  # fmt: skip
        f"--out models holds --checkpoint {CHECKPOINT}: replacing that folder would delete it",
        setup=params_with(),
        files={CHECKPOINT: b"the run's checkpoint", TOKENIZER: b"its subword model"},
    )
)

# ---- hostile corpus files --------------------------------------------------------------------


def corpus_with(name: str, write: Callable[[Path], None], *overrides: str):
    """A setup: the real corpus (links to its files) with `name` replaced by what `write`
    makes, and params.yaml reading it without a download."""

    def setup(workspace: Path) -> dict[str, str]:
        corpus = workspace / "corpus"
        corpus.mkdir()
        for path in CORPUS.glob("*.gz"):
            (corpus / path.name).symlink_to(path)
        (corpus / name).unlink()
        write(corpus / name)
        params_with(f"data.raw_dir={corpus}", "data.download=false", *overrides)(workspace)
        return {"MULTI30K_DIR": ""}  # which would stand in for data.raw_dir

    return setup


SCENARIOS += [
    Scenario("check refuses a gzip bomb past data.limits.max_file_mb", CHECK,
             "train.en.gz: more than 4 MiB of text",
             setup=corpus_with("train.en.gz", partial(gzip_bomb, megabytes=8,
                                                      line=b"two dogs are playing in the snow .\n"),
                               "data.limits.max_file_mb=4")),
    Scenario("check refuses a line past data.limits.max_line_bytes", CHECK,
             "train.de.gz:1: the line is longer than 65536 bytes",
             setup=corpus_with("train.de.gz", partial(gzip_bomb, megabytes=2, line=b"a "))),
]  # fmt: skip

# ---- a server that trickles ------------------------------------------------------------------


def trickling_server(chunk: int, every: float, headers_every: float | None = None) -> str:
    """The URL of a server that sends `chunk` bytes every `every` seconds, each read in time
    (`tests.test_download.TricklingHandler`), its headers too a byte every `headers_every`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TricklingHandler)
    server.daemon_threads = True
    server.size, server.chunk, server.every = 1 << 20, chunk, every
    server.headers_every = headers_every
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def download_from(url: str, *bounds: str):
    def setup(workspace: Path) -> dict[str, str]:
        params_with(f"data.raw_dir={workspace / 'no_copy'}", f"data.url={url}",
                    "data.limits.download_read_timeout_s=2", *bounds)(workspace)  # fmt: skip
        return {"MULTI30K_DIR": ""}

    return setup


SCENARIOS += [
    Scenario("check ends a body trickling below data.limits.download_min_rate_kb_s", CHECK,
             "data.limits.download_min_rate_kb_s=1",
             setup=download_from(trickling_server(1, 0.5), "data.limits.download_grace_s=2",
                                 "data.limits.download_min_rate_kb_s=1")),
    Scenario("check ends headers trickling below data.limits.download_min_rate_kb_s", CHECK,
             "data.limits.download_min_rate_kb_s=1",
             setup=download_from(trickling_server(4096, 0.5, headers_every=0.5),
                                 "data.limits.download_grace_s=2",
                                 "data.limits.download_min_rate_kb_s=1")),
    Scenario("check ends headers trickling past data.limits.download_deadline_s", CHECK,
             "data.limits.download_deadline_s=3",
             setup=download_from(trickling_server(4096, 0.5, headers_every=0.5),
                                 "data.limits.download_deadline_s=3")),
]  # fmt: skip

# ---- study specs -----------------------------------------------------------------------------

SPEC = {**GRID_SPEC, "study": "outside"}
SEARCH = {"kind": "search", "space": {"model.dropout": {"type": "float", "low": 0.0, "high": 0.5}}}
BAD_SPECS = [
    ("seeds: []", {"seeds": []}, "key 'seeds': must be a list of at least one item"),
    ("negative seeds", {"seeds": [-1, 2]}, "key 'seeds': item 0: must be in"),
    ("settings: {foo: 1}", {"settings": {"foo": 1}}, "unknown key(s) ['settings.foo']"),
    ("objective: val/bleu", {"objective": "val/bleu"}, "key 'objective': must be a mapping"),
    ("objective without direction", {"objective": {"metric": "val/bleu"}},
     "missing key 'objective.direction'"),
    ("a variant name of 300 characters", {"variants": {"x" * 300: {}}},
     f"key 'variants.{'x' * 300}': "),
    ("a variant name holding a newline", {"variants": {"a\nb": {}}}, "is not a folder name"),
    ("a grid of 10000 seeds", {"seeds": list(range(10_000))},
     "key 'settings.max_grid_points': the grid holds 10000"),
    ("heartbeat_interval: -1", {"settings": {"heartbeat_interval": -1}},
     "key 'settings.heartbeat_interval': must be"),
    ("n_trials: -1", {**SEARCH, "n_trials": -1}, "key 'n_trials': must be null or >= 1"),
]  # fmt: skip


def as_a_checkout(workspace: Path) -> None:
    """The workspace as the root of a checkout (its dvc.yaml and conf/, linked), where the
    sweep runs."""
    for name in ("dvc.yaml", "conf"):
        (workspace / name).symlink_to(REPO_ROOT / name)


def spec_with(change: dict) -> Callable[[Path], dict[str, str]]:
    def setup(workspace: Path) -> dict[str, str]:
        as_a_checkout(workspace)
        (workspace / "spec.yaml").write_text(yaml.safe_dump({**SPEC, **change}))
        return {}

    return setup


SWEEP = [sys.executable, "-m", "pipeline.sweep", "spec.yaml", "--results-dir", "results",
         "--work-dir", "work"]  # fmt: skip
SCENARIOS += [
    Scenario(f"the sweep refuses {name}", SWEEP, message, setup=spec_with(change))
    for name, change, message in BAD_SPECS
]  # fmt: skip


def spec_of_seeds(count: int) -> Callable[[Path], dict[str, str]]:
    """A setup writing a grid spec of `count` seeds (as text: dumping the list takes longer
    than the sweep may take to refuse it)."""

    def setup(workspace: Path) -> dict[str, str]:
        as_a_checkout(workspace)
        head = yaml.safe_dump({key: value for key, value in SPEC.items() if key != "seeds"})
        seeds = "".join(f"- {seed}\n" for seed in range(count))
        (workspace / "spec.yaml").write_text(f"{head}seeds:\n{seeds}")
        return {}

    return setup


SCENARIOS.append(
    Scenario("the sweep refuses a grid of 10**6 seeds, counted before it is built", SWEEP,
             "key 'settings.max_grid_points': the grid holds 1000000 points",
             setup=spec_of_seeds(10**6))
)  # fmt: skip


# ---- files that are not what they claim ----------------------------------------------------

TRAIN = [sys.executable, "-m", "pipeline.stages.train"]
SCENARIOS += [
    Scenario(f"{stage} names params.yaml's line when it is {what}",
             [sys.executable, "-m", f"pipeline.stages.{stage}"], message,
             files={"params.yaml": content})
    for stage in ("check", "train")
    for what, content, message in [
        ("not YAML", b"seed: [1,\n  2\nmodel: {", "error: params.yaml:3:6: not valid YAML"),
        ("binary", b"\x00\xff\xfe binary", "error: params.yaml:1: not UTF-8 text"),
    ]
]  # fmt: skip


def a_users_database(workspace: Path) -> dict[str, str]:
    """A checkout, a spec, and the user's own SQLite file given as the study's storage."""
    spec_with({})(workspace)
    with sqlite3.connect(workspace / "expenses.db") as database:
        database.execute("CREATE TABLE expenses (day TEXT, amount REAL)")
        database.execute("INSERT INTO expenses VALUES ('2026-01-01', 12.5)")
    return {}


SCENARIOS.append(
    Scenario("the sweep refuses an SQLite file of other tables as its storage",
             [*SWEEP, "--storage", "sqlite:///expenses.db"],
             "--storage expenses.db holds tables that are not Optuna's (expenses)",
             setup=a_users_database)
)  # fmt: skip

NOT_A_CHECKPOINT = {"model.ckpt": b"two dogs are playing in the snow .\n", TOKENIZER: b"spm"}
SCENARIOS += [
    Scenario(f"{command} says a text file is not a checkpoint",
             [sys.executable, "-m", f"pipeline.{command}", "--checkpoint", "model.ckpt",
              "--tokenizer", TOKENIZER, *extra],
             "error: model.ckpt: not a checkpoint (torch.save writes a zip archive",
             files=NOT_A_CHECKPOINT)
    for command, extra in [("translate", ["--input", "model.ckpt"]), ("export", ["--out", "ct2"])]
]  # fmt: skip


# ---- running them ----------------------------------------------------------------------------


def run(scenario: Scenario, workspace: Path) -> str | None:
    """None if the scenario held; else what went wrong."""
    for name, content in scenario.files.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_bytes(content)
    (workspace / "home").mkdir()  # no cache or config of this machine's user is read or written
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": str(workspace / "home"),
           "WANDB_MODE": "offline", **scenario.setup(workspace)}  # fmt: skip
    env = {name: value for name, value in env.items() if value != ""}
    before = snapshot(workspace)
    try:
        done = subprocess.run(scenario.command, cwd=workspace, env=env, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"still running after {COMMAND_TIMEOUT_S} s"
    stderr = done.stderr
    if done.returncode != scenario.exit_code:
        return f"exit {done.returncode}, not {scenario.exit_code}: {stderr[-2000:]}"
    if scenario.message not in stderr:
        return f"no {scenario.message!r} in: {stderr[-2000:]}"
    if "Traceback" in stderr:
        return f"a traceback: {stderr[-2000:]}"
    after = snapshot(workspace)
    if after != before:
        changed = sorted(set(after) ^ set(before) | {k for k in after if after[k] != before.get(k)})
        return f"the workspace changed: {changed}"
    return None


def main() -> int:
    failed = 0
    for scenario in SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="outside-") as folder:
            started = time.monotonic()
            problem = run(scenario, Path(folder))
        seconds = time.monotonic() - started
        print(f"{'held  ' if problem is None else 'FAILED'} {scenario.name} ({seconds:.1f} s)"
              + (f": {problem}" if problem else ""), flush=True)  # fmt: skip
        failed += problem is not None
    print(f"{len(SCENARIOS) - failed} of {len(SCENARIOS)} scenarios held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
