"""Evaluation: scoring (sacreBLEU), plots, the evaluate stage; `pipeline.translate` uses it.

Kept import-light (no torch here, nor in `outputs`, the names of what the stage writes) so the
translate CLI can resolve its defaults and answer a usage error at once.
"""
