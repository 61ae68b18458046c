"""`python -m pipeline.export`: see pipeline.export.command."""

from pipeline.export.command import console

console()
