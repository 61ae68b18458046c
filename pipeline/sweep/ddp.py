"""A trial's DDP world: Lightning's launcher re-runs the worker's command for ranks > 0, and
`TRIAL_ENV` tells them which trial they join (`trial.run_trial_rank`)."""

from __future__ import annotations

import contextlib
import os

import torch

TRIAL_ENV = "PIPELINE_SWEEP_TRIAL"  # set for the DDP ranks Lightning launches: the trial number


@contextlib.contextmanager
def trial_ddp_world(trial_number: int):
    """One trial's DDP world, torn down after it. Lightning's launcher marks the process as
    launched (LOCAL_RANK, MASTER_PORT, ... in os.environ) and keeps the process group: a
    worker's next trial would then wait for ranks that have exited instead of launching its
    own. `TRIAL_ENV` tells the launched ranks which trial they join."""
    saved = dict(os.environ)
    os.environ[TRIAL_ENV] = str(trial_number)
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
