"""The variables DVC sets in the environment of every stage it runs (its `dvc.env`)."""

DVC_STAGE = "DVC_STAGE"  # the stage's name: this process is a stage `dvc repro` runs
DVC_ROOT = "DVC_ROOT"  # the root of the DVC repository
DVC_EXP_NAME = "DVC_EXP_NAME"  # the experiment's name, under `dvc exp run` only
