"""Entry-point helper: user errors print their message, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline.errors import PipelineError

EXIT_USER_ERROR = 2


def main(entry: Callable[[], object]) -> None:
    """Run `entry`; a PipelineError prints `error: <message>` and exits 2."""
    try:
        entry()
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
