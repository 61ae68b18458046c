"""`python -m pipeline.sweep`: see pipeline.sweep.cli."""

from pipeline.sweep.cli import console

console()
