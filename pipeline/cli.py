"""Entry-point helper: user errors print their message, not a traceback; a DVC stage refuses
to finish when params.yaml changed under it; every command answers `--help` and refuses
arguments it does not know (argparse: usage on stderr, exit 2) before it spends compute."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from pipeline.console import install_warning_format
from pipeline.errors import ConfigError, PipelineError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for a command Ctrl-C ended
PARAMS_FILE = "params.yaml"  # what every stage reads (pipeline.config.load), in its cwd
PIPELINE_FILE = "dvc.yaml"


def parser(prog: str, doc: str | None, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <prog>` whose description is the module docstring's
    first paragraph and whose epilog is the rest (its usage lines, what it reads and writes)."""
    first, _, rest = (doc or "").strip().partition("\n\n")
    kwargs.setdefault("epilog", rest or None)
    return argparse.ArgumentParser(
        prog=f"python -m {prog}",
        description=first,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )


def positive_int(text: str) -> int:
    """argparse's `type=` for a count or a size: an integer >= 1 (else usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def stage_args(prog: str, doc: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of a DVC stage: it takes no arguments (its settings come from
    params.yaml), so `--help` describes it and anything else is a usage error (exit 2)."""
    return parser(prog, doc).parse_args(argv)


def _stage_params(stage: str) -> list[str] | None:
    """The params.yaml keys `stage` depends on, as dvc.yaml lists them (None: no such list,
    every key counts)."""
    try:
        stages = yaml.safe_load(Path(PIPELINE_FILE).read_text(encoding="utf-8"))["stages"]
        listed = stages[stage]["params"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    return [key for key in listed if isinstance(key, str)]  # {file: [...]}: other files


def _params_snapshot(stage: str) -> dict:
    """The leaf values of the stage's params now ({} without a params file)."""
    from pipeline.config import leaves, subtree  # not at import: the train stage starts fast

    try:
        params = yaml.safe_load(Path(PARAMS_FILE).read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError):  # unreadable: the stage's load names why
        return {}
    if not isinstance(params, dict):
        return {}
    keys = _stage_params(stage) or list(params)
    found = {}
    for key in keys:
        found.update(leaves(subtree(params, key), key))
    return found


def _check_params_unchanged(
    stage: str, before: dict, kept: Callable[[], str | None] | None = None
) -> None:
    """Another command (`dvc exp run -S ...` in the same workspace) may rewrite params.yaml
    while a stage runs: DVC would then record this stage's outputs under values they were not
    made with. Refuse to finish instead (the outputs stay; the next `dvc repro` decides).
    `kept`: where the stage keeps what it made and how to record it, said instead of the
    advice to run it again."""
    after = _params_snapshot(stage)
    changed = sorted(key for key in before.keys() | after.keys()
                     if before.get(key) != after.get(key))  # fmt: skip
    if changed:
        details = "; ".join(f"'{k}' was {before.get(k)!r}, now {after.get(k)!r}" for k in changed)
        raise ConfigError(
            f"{PARAMS_FILE} changed while the {stage} stage ran: {details}. This stage worked "
            f"with the values it started with, so it does not report success under the new "
            "ones (DVC would record them). "
            + ((kept and kept()) or "Run it again (`dvc repro`) once the other command is done.")
        )


def main(
    entry: Callable[[], object],
    stage: str | None = None,
    kept: Callable[[], str | None] | None = None,
) -> None:
    """Run `entry`; a PipelineError prints `error: <message>` and exits with its `exit_code`:
    2 (EXIT_USER_ERROR) for user errors, 3 for a preempted training run (checkpoint saved,
    run again to resume; see `pipeline.training.preemption`); a Ctrl-C elsewhere prints one
    line and exits 130. With `stage` (a DVC stage reading params.yaml), finishing is refused if
    that stage's params changed meanwhile (`kept`: what the stage keeps of its work then, and
    how to record it). Warnings print as one line each (`pipeline.console`)."""
    install_warning_format()
    try:
        before = _params_snapshot(stage) if stage else None
        entry()
        if stage:
            _check_params_unchanged(stage, before, kept)
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", EXIT_USER_ERROR))
    except KeyboardInterrupt:  # Ctrl-C outside training (which stops at a checkpoint instead)
        print("error: interrupted (Ctrl-C); run the same command again", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
