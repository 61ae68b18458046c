"""The fairseq harness: fairseq 0.12 beside this pipeline, one module per job (docs/lab.md).

Modules that run inside fairseq's venv import only the standard library and torch at module
level, and this file imports nothing.
"""
