"""One error type for everything a user can cause: bad data, bad config, missing paths.

The CLIs print the message without a traceback (see `pipeline.cli.main`), so the
message itself must name the file, line or key, and say what to do about it.
"""


class PipelineError(Exception):
    """A problem the user can fix; the message names the file/line/key and the fix."""

    exit_code = 2  # what a CLI exits with (`pipeline.cli.main`)


class ConfigError(PipelineError):
    """An unknown, ill-typed or impossible configuration value."""


class DataError(PipelineError):
    """A corpus or artifact that is missing, misaligned, empty or corrupt."""


class Preempted(PipelineError):
    """Training stopped on a preemption signal after saving a checkpoint; running the same
    command again resumes from it (see `pipeline.training.preemption`)."""

    exit_code = 3
