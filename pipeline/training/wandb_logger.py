"""Training's W&B logger: Lightning's WandbLogger on a run that `pipeline.tracking` starts (mode,
fallback, config, tags, group)."""

from __future__ import annotations

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from pipeline.config_schema import Config
from pipeline.tracking import finish_run, start_wandb_run


class PipelineWandbLogger(WandbLogger):
    """Lightning's WandbLogger whose run comes from `start_wandb_run` (mode, fallback, config,
    tags, group), created lazily on global rank zero only: one W&B run per training, also
    under DDP. A failed fit finishes the run as failed; `finish()` ends a successful one after
    the caller has added its summary.

    With `run` (a sweep trial's run, say) the logger logs into it and leaves finishing it to
    its owner."""

    def __init__(
        self,
        cfg: Config,
        job_type: str,
        name: str | None = None,
        group: str | None = None,
        run=None,
    ):
        super().__init__(project=cfg.logger.wandb.project, save_dir=cfg.paths.wandb_dir)
        self._start = (cfg, job_type, name, group)
        self._given_run = run

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            self._experiment = self._given_run or start_wandb_run(*self._start)
            # Lightning's x axis: every metric is plotted against the optimizer step.
            self._experiment.define_metric("trainer/global_step")
            self._experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
        return self._experiment

    def finalize(self, status: str) -> None:
        super().finalize(status)
        if status != "success":
            self.finish(exit_code=1)

    def finish(self, exit_code: int = 0) -> None:
        if self._experiment is not None and self._given_run is None:
            finish_run(self._experiment, exit_code=exit_code)


def wandb_logger(
    cfg: Config, job_type: str, name: str | None = None, group: str | None = None, run=None
) -> PipelineWandbLogger:
    """The Lightning logger for a training run (see `PipelineWandbLogger`)."""
    return PipelineWandbLogger(cfg, job_type, name=name, group=group, run=run)
