"""Entry-point helper: user errors print their message, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline.errors import PipelineError

EXIT_USER_ERROR = 2


def main(entry: Callable[[], object]) -> None:
    """Run `entry`; a PipelineError prints `error: <message>` and exits with its `exit_code`:
    2 (EXIT_USER_ERROR) for user errors, 3 for a preempted training run (checkpoint saved,
    run again to resume; see `pipeline.training.preemption`)."""
    try:
        entry()
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", EXIT_USER_ERROR))
