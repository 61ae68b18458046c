"""Optuna ablation sweeps: `python -m pipeline.sweep ablations/<spec>.yaml [--storage URL] [--n-trials N]`.

A trial is the same code path as `dvc repro`: its config is conf/ composed with the study's base
experiment, budget and the trial's overrides, then `training.trainer.run(cfg)` and
`evaluation.evaluate.run(cfg)` run in-process, into the trial's own directory, as one W&B run
(group = study, job_type = trial).

Many workers, on one machine or many, run the same command against one storage URL:
- grid studies: the worker that creates the study enqueues every (variant, seed) point once, in
  Optuna GridSampler's order; workers claim WAITING trials atomically (the storage's row lock), so
  no point runs twice and a finished study runs nothing new. (GridSampler alone re-runs unfinished
  points once every point has started, and a random point when the study is re-run.)
- search studies: TPE with a seed, `n_trials` finished trials in total across workers.
- heartbeats: a worker that dies leaves a RUNNING trial whose heartbeat goes stale; the next worker
  to look marks it failed and re-enqueues its parameters (`RetryInterruptedTrial`, at most
  `settings.max_retries` times). A worker stopped by SIGTERM/SIGUSR1 saves the trial's checkpoint,
  marks the trial failed and re-enqueues its point at once (not counted as a retry). A worker
  whose storage records none of its heartbeats for `grace_period - heartbeat_interval` seconds
  stops the trial the same way, but leaves the storage alone: others retry the stale trial. One
  whose heartbeat went stale while it evaluated records nothing if the storage no longer has its
  trial RUNNING (another worker has counted it dead and runs the point again).
- a trial trains in its point's own work directory (`<work-dir>/<study>-<key>/<variant>-seed<seed>/`,
  the key a hash of the study's storage and id; locked while a worker trains there;
  outside the repository: checkpoints, averaged model, heatmaps), so the re-run of an interrupted
  point resumes from its checkpoint instead of training from step 0. A finished trial's record
  (metrics, params, val and test hypotheses, validation curves, run info) is copied into
  `<results-dir>/<study>/trials/<point>/`, beside the study's storage: commit that folder and
  another machine continues the study where this one stopped, never re-running a finished point.
- DDP trials (`train.devices` > 1): the worker is rank 0. Lightning's DDP launcher starts the other
  ranks by re-running this command; `PIPELINE_SWEEP_TRIAL` in their environment makes them join
  that one trial's training (`run_trial_rank`) instead of acting as workers. Rank 0 reports every
  validation to the study and decides on pruning; the decision is broadcast so every rank stops
  at the same step. The ranks share the trial through the RDB storage (SQLite or a server).

One job per module: `spec` (study specs and each trial's config; `spec_files` reads a spec's
YAML, `spec_schema` declares its keys with their domains, `spec_checks` holds the checks beyond
one key's type), `work_dirs` (a study's work folder),
`storage` (the shared database and the study in it), `pin` (what a study's trials run at),
`claims` (which trial runs next, retries; Optuna's private API behind a few functions),
`heartbeat`, `trial_params` (a trial's values and folders), `trial` (train + evaluate + record
one trial), `pruning`, `ddp`, `records`, `worker` (the loop), `summary` (what a worker prints),
`cli` and `launch` (N workers on one machine). The names below are the package's public API (`cli` and `heartbeat` are also modules:
import those functions from them).
"""

from pipeline.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "claims": ["FINISHED", "RetryInterruptedTrial", "claim_waiting_trial", "retry_failed"],
        "cli": ["console"],
        "trial_params": ["grid_values", "point_name", "suggest_params"],
        "records": ["RUN_FILE", "read_attempts"],
        "spec": ["RESULTS_ROOT", "WORK_ROOT", "StudySpec", "SweepSettings", "TrialPaths",
                 "load_spec", "point_config", "trial_config"],
        "storage": ["default_storage", "open_storage", "open_study"],
        "summary": ["study_summary"],
        "worker": ["run_worker"],
    },
)  # fmt: skip
