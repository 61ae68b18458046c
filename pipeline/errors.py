"""One error type for everything a user can cause: bad data, bad config, missing paths.

The CLIs print the message without a traceback (see `pipeline.cli.main`), so the
message itself must name the file, line or key, and say what to do about it.
"""


class PipelineError(Exception):
    """A problem the user can fix; the message names the file/line/key and the fix."""


class ConfigError(PipelineError):
    """An unknown, ill-typed or impossible configuration value."""


class DataError(PipelineError):
    """A corpus or artifact that is missing, misaligned, empty or corrupt."""
