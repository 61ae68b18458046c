"""`python -m pipeline.report`: see pipeline.report.cli."""

from pipeline.report.cli import console

console()
