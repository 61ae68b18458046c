"""Whether a run continues a checkpoint, and what happens to the runs it does not continue.

A resumed run must compute what an uninterrupted one would, so a checkpoint is only continued by a
config that differs from its own in keys that cannot change the weights (`RESUME_FREE_KEYS`);
an interrupted run that another config finds is refused, naming the key, because its checkpoints
exist nowhere else. Runs that are not continued are moved aside (`<train_dir>.replaced/`), never
deleted; a run DVC runs is kept beside the stage's output until DVC records it
(`<train_dir>.preempted/`: hard links at every save, the files themselves when it stops; see
`pipeline.training.kept_runs`), out of reach of the next checkout, and put back before the next
run: a SIGKILL costs the steps since the last checkpoint, never the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import filecmp
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from pipeline.atomic import remove_stale_temps, write_json_atomic
from pipeline.config import leaves, subtree, to_dict, with_runtime_section
from pipeline.config_schema import Config
from pipeline.data.download import sha256_of
from pipeline.errors import ConfigError
from pipeline.training.checkpoints import (
    LAST_NAME,
    PRECISION_KEY,
    PROGRESS_NAME,
    SOURCE_HASH_KEY,
    checkpoint_dir,
    find_resume_checkpoint,
    link_checkpoints,
    move_checkpoints,
    portable_config,
    read_checkpoint,
    remove_checkpoints,
    source_hash,
    stash_checkpoints,
)
from pipeline.training.kept_runs import (
    PREEMPTED_SUFFIX,
    REPLACED_SUFFIX,
    is_finished,
    kept_checkpoints,
    kept_state,
    note_run,
    under_dvc,
)

log = logging.getLogger(__name__)

# A resumed run must compute what an uninterrupted one would: every key of these sections must
# match the checkpoint's, except RESUME_FREE_KEYS.
RESUME_FIXED_KEYS = ("seed", "model", "data", "train", "runtime")
# Keys that cannot change the weights a run ends with (where the corpus is read from, how
# often it validates and logs, on which devices and how fast it runs, how many checkpoints it
# keeps). `train.max_steps` may grow (extending a run) unless a cool-down depends on it. The
# number of processes may not change mid-run (it sets the global batch): the checkpoint's
# world size is checked where it loads (`TranslationModule.on_load_checkpoint`).
RESUME_FREE_KEYS = (
    "data.raw_dir",
    "data.test_splits",  # never read by training: a new test set costs an evaluation only
    "data.download",
    "data.url",
    "train.max_steps",
    "train.val_check_interval",
    "train.val_bleu",
    "train.val_bleu_max_sentences",
    "train.accelerator",
    "train.devices",
    "train.num_nodes",
    "train.strategy",
    "train.ddp_timeout",
    "train.float32_matmul_precision",  # GPU numerics, like the device itself
    "train.num_workers",
    "train.save_top_k",
    "train.early_stopping_patience",
    "train.resume",
    "train.compile",
    "train.log_every_n_steps",
    "train.progress_bar",
    "train.progress_every",
    "train.deterministic",
    "runtime.bf16_min_speedup",
    "runtime.compile_loss",
    "runtime.cpu_mmap_threshold_mb",
    "runtime.onednn_primitive_cache",
)
REPLACED_RECORD = "replaced.json"  # in each of them: its fingerprint, why it moved, its step
LOCK_SUFFIX = ".lock"  # <train_dir>.lock: held by the process training there


def _rank() -> int:
    """This process's rank in a DDP job (0 alone), as Lightning reads it from the launcher's
    environment: imported here, so that checking a checkpoint's config (the evaluate stage)
    does not load Lightning."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank


def config_differences(saved: dict, cfg: Config) -> tuple[list[str], list[str]]:
    """(fixed, free): the keys whose values differ between a checkpoint's config and `cfg`,
    split into those that change what the run computes and those that cannot."""
    saved = with_runtime_section(saved)  # a checkpoint of the older layout compares as today's
    # A checkpoint writes its paths portably: both sides compare so.
    saved, current = portable_config(saved), portable_config(to_dict(cfg))
    defaults = to_dict(Config())
    fixed, free = [], []
    for section in RESUME_FIXED_KEYS:
        # A key the checkpoint's config lacks is newer than it: its default is what ran.
        before = {**leaves(subtree(defaults, section), section),
                  **leaves(subtree(saved, section), section)}  # fmt: skip
        now = leaves(subtree(current, section), section)
        for key in sorted(set(before) | set(now)):
            if before.get(key) == now.get(key):
                continue
            if key.startswith(("data.sha256", "data.limits.")):  # what is read, not how
                free.append(key)
            elif key == "train.max_steps":
                cooldown = subtree(current, "train.cooldown_steps")
                (fixed if cooldown else free).append(key)  # the cool-down starts from it
            else:
                (free if key in RESUME_FREE_KEYS else fixed).append(key)
    return fixed, free


def _describe(key: str, saved: dict, cfg: Config) -> str:
    return f"'{key}' is {subtree(to_dict(cfg), key)!r} (the checkpoint's: {subtree(saved, key)!r})"


def check_same_run(
    checkpoint_path: Path, cfg: Config, refusal: str, saved: dict | None = None
) -> list[str]:
    """Raise a ConfigError naming the key(s), followed by `refusal`, if `cfg` differs from the
    checkpoint's config in a key that changes what the run computes; return the keys that
    differ but cannot change it (RESUME_FREE_KEYS) as descriptions. `saved`: the checkpoint's
    config when the caller has already read it (else it is read from `checkpoint_path`)."""
    if saved is None:
        saved = read_checkpoint(checkpoint_path)["hyper_parameters"]["config"]
    saved = with_runtime_section(saved, str(checkpoint_path))
    fixed, free = config_differences(saved, cfg)
    if fixed:
        details = "; ".join(_describe(key, saved, cfg) for key in fixed)
        raise ConfigError(
            f"config key '{fixed[0]}' differs from {checkpoint_path}'s: {details}. {refusal}"
        )
    return [_describe(key, saved, cfg) for key in free]


def check_resumable(checkpoint_path: Path, cfg: Config, saved: dict | None = None) -> None:
    """A checkpoint may only be continued by a config that computes the same run; anything
    else is a ConfigError naming the key(s). Differences in keys that cannot change the result
    (RESUME_FREE_KEYS) are listed in a warning. `saved` as in `check_same_run`."""
    free = check_same_run(
        checkpoint_path,
        cfg,
        "A resumed run must keep every setting that changes its result. Restore the value(s), "
        "or start over with train.resume=false (the run is moved aside, not deleted) or "
        "another paths.train_dir.",
        saved,
    )
    if free:
        warnings.warn(
            f"resuming {checkpoint_path} with other values of keys that do not change the "
            f"result: {'; '.join(free)}",
            stacklevel=2,
        )


def stopped_early(checkpoint: dict) -> bool:
    """Whether early stopping ended the run that saved `checkpoint`: Lightning's EarlyStopping
    state in it holds its reason (0: not stopped; the checkpoint callbacks run after it, so the
    last validation's files hold the decision). Such a run is finished, short of max_steps."""
    return any(
        name.startswith("EarlyStopping") and state.get("stopping_reason", 0) != 0
        for name, state in checkpoint.get("callbacks", {}).items()
    )


class ResumePoint(NamedTuple):
    """Where training continues: the checkpoint (None: train anew), the precision it was trained
    in (None where not recorded), the step it was saved at and whether early stopping had ended
    its run, read once from the checkpoint (a CRC-checked read of the whole file)."""

    checkpoint: Path | None = None
    trained_in: str | None = None
    step: int = 0
    stopped_early: bool = False


def resume_checkpoint(cfg: Config, keep_finished: bool = False) -> Path | None:
    """The checkpoint to continue from, or None to train anew (see `resume_point`)."""
    return resume_point(cfg, keep_finished).checkpoint


def resume_point(cfg: Config, keep_finished: bool = False) -> ResumePoint:
    """The checkpoint to continue from (None: train anew), with what training needs of it.

    With `train.resume`:
    - an interrupted run (short of its own `max_steps`) continues when the config computes the
      same run (`check_resumable`); otherwise a ConfigError names the key, since its
      checkpoints exist nowhere else. A `train.max_steps` below its progress is refused too;
    - a finished run (at its `max_steps`, or ended by early stopping: `stopped_early`) of the
      same config and the same code is done: it is returned, and training restores it and
      stops at once (a `dvc repro` whose lock was never written
      records it instead of retraining it). With a larger `train.max_steps` it is extended.
      `keep_finished` (sweeps) keeps it whatever the code version;
    - a finished run of another config or other code (`dvc repro` after a code change, `dvc exp
      run -S model.heads=8`) is moved aside to `<train_dir>.replaced/` and trained anew.
    `train.resume=false` also moves the previous run aside: nothing is deleted.
    """
    train_dir = Path(cfg.paths.train_dir)
    if _rank() == 0:  # half-written files of a writer that was killed
        remove_stale_temps(checkpoint_dir(train_dir))
    restore_preempted_run(cfg)
    if not cfg.train.resume:
        _move_aside(train_dir, "train.resume=false")
        return ResumePoint()
    path = find_resume_checkpoint(train_dir)
    if path is None:
        return ResumePoint()
    checkpoint = read_checkpoint(path)
    step, early = int(checkpoint["global_step"]), stopped_early(checkpoint)
    here = ResumePoint(path, checkpoint.get(PRECISION_KEY), step, early)
    saved = checkpoint["hyper_parameters"]["config"]
    trained_to = subtree(saved, "train.max_steps")
    if step < trained_to and not early:  # interrupted: never discarded unsaid
        if cfg.train.max_steps < step:
            raise ConfigError(
                f"train.max_steps={cfg.train.max_steps} is below step {step}, which the "
                f"interrupted run in {path.parent} already reached: raise it (to at least "
                f"{step}), or start over with train.resume=false"
            )
        check_resumable(path, cfg, saved)
        return here
    fixed, _ = config_differences(saved, cfg)
    same_code = keep_finished or checkpoint.get(SOURCE_HASH_KEY) == source_hash()
    if fixed and fixed != ["train.max_steps"] or not same_code:
        why = "its code differs" if not fixed else f"its config differs in {', '.join(fixed)}"
        _move_aside(train_dir, f"the finished run there is another experiment ({why})")
        return ResumePoint()
    if cfg.train.max_steps < step:
        _move_aside(train_dir, f"its run reached step {step}, beyond train.max_steps")
        return ResumePoint()
    return here  # done (nothing to train) or, with a larger max_steps, extended


def _move_aside(train_dir: Path, why: str, then: str | None = None) -> None:
    """Move a previous run's checkpoints to `<train_dir>.replaced/<time>/` (never delete), with
    a record of what it was and why it moved (REPLACED_RECORD). A run already kept there, byte
    for byte (a finished run DVC's checkout restores each time `dvc exp run` moves it aside),
    is not kept twice. `then`: what happens next (default: training anew)."""
    if _rank() != 0:
        return
    directory = checkpoint_dir(train_dir)
    then = then or f"training anew in {directory}"
    fingerprint = run_fingerprint(directory)
    if fingerprint is None:
        return
    replaced = _beside(train_dir, REPLACED_SUFFIX)
    kept = next((run for run in _replaced_runs(replaced)
                 if _recorded_fingerprint(run) == fingerprint), None)  # fmt: skip
    if kept is not None:
        removed = remove_checkpoints(train_dir)
        warnings.warn(
            f"{then}: {why}; the previous run ({len(removed)} checkpoint files) is already "
            f"kept in {kept}",
            stacklevel=3,
        )
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    destination, n = replaced / stamp, 1
    while destination.exists():  # another run moved aside within the same second
        n += 1
        destination = replaced / f"{stamp}-{n}"
    moved = move_checkpoints(train_dir, destination)
    if moved:
        from pipeline.disk_usage import leftovers_message

        progress = destination / PROGRESS_NAME
        step = json.loads(progress.read_text())["step"] if progress.is_file() else None
        record = {"fingerprint": fingerprint, "why": why, "step": step, "moved_at": stamp}
        write_json_atomic(destination / REPLACED_RECORD, record)
        warnings.warn(
            f"{then}: {why}; moved the previous run's {len(moved)} checkpoint files to "
            f"{destination}. Runs moved aside: {leftovers_message([destination.parent])}",
            stacklevel=3,
        )


def run_fingerprint(directory: Path) -> str | None:
    """What identifies a run's checkpoints byte for byte: the SHA-256 of its `last.ckpt` (the
    run's whole state at its newest step), else of its newest checkpoint file; None without
    one."""
    files = sorted(directory.glob("*.ckpt")) if directory.is_dir() else []
    files = [p for p in files if not p.name.startswith(".")]
    if not files:
        return None
    last = directory / LAST_NAME
    newest = last if last in files else max(files, key=lambda p: p.stat().st_mtime)
    return sha256_of(newest)


def replaced_record(run: Path) -> dict | None:
    """The record a run moved aside carries (None for one moved before records existed)."""
    try:
        return json.loads((run / REPLACED_RECORD).read_text())
    except (OSError, ValueError):
        return None


def _replaced_runs(replaced: Path) -> list[Path]:
    return sorted(p for p in replaced.iterdir() if p.is_dir()) if replaced.is_dir() else []


def _recorded_fingerprint(run: Path) -> str | None:
    record = replaced_record(run)
    return record.get("fingerprint") if record else run_fingerprint(run)


def _beside(train_dir: str | Path, suffix: str) -> Path:
    """`<train_dir><suffix>`: a folder beside the train stage's output, not part of it."""
    train_dir = Path(train_dir)
    return train_dir.with_name(train_dir.name + suffix)


def preempted_checkpoints(cfg: Config) -> Path:
    """Where a run DVC runs keeps its checkpoints out of the next checkout's reach until DVC
    records them: mirrored there by hard links at every save (a SIGKILL, or `dvc` itself
    ending first, leaves them there), moved there when it stops."""
    return kept_checkpoints(cfg.paths.train_dir)


def keep_until_recorded(cfg: Config) -> None:
    """Under DVC, the checkpoints a run starts from (resumed, or a finished run recorded
    without training, which saves nothing) are linked out of the next checkout's reach, as
    every checkpoint it saves will be (`AtomicCheckpointIO`), until DVC has recorded them: DVC
    may end before it does. Linked once the run is settled on, before another process can
    put other files in its folder."""
    if _rank() == 0 and under_dvc():
        link_checkpoints(checkpoint_dir(cfg.paths.train_dir), preempted_checkpoints(cfg))


def note_kept_run(cfg: Config) -> None:
    """Under DVC, record which run the kept checkpoints are (once the run is settled on)."""
    if _rank() == 0 and under_dvc():
        note_run(cfg.paths.train_dir, cfg.experiment_name, cfg.train.max_steps)


@contextlib.contextmanager
def training_lock(cfg: Config) -> Iterator[None]:
    """Hold `<train_dir>.lock` while training there. A second run on the same folder (the same
    `dvc exp run` again right after a stop, while the stopped stage is still saving and
    moving its checkpoints aside: DVC exits at once on SIGTERM) waits for the first to end,
    saying so, instead of working on its checkpoints at the same time. The lock dies with
    its process, however it ends."""
    if _rank() != 0:
        yield
        return
    path = _beside(cfg.paths.train_dir, LOCK_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            print(
                f"waiting for the training process {holder}, still running in "
                f"{cfg.paths.train_dir}, to end",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def stash_preempted_run(cfg: Config) -> Path | None:
    """Take a stopped run's checkpoints out of the train stage's output, which the next `dvc
    exp run` deletes before it runs (DVC never recorded it), into the folder that mirrors
    them (`stash_checkpoints`); `resume_point` moves them back. Returns where they went
    (None: there were none, or another rank moves them)."""
    kept = preempted_checkpoints(cfg)
    if _rank() != 0:
        return None
    stash_checkpoints(cfg.paths.train_dir, kept)
    return kept if any(kept.glob("*.ckpt")) else None


def restore_preempted_run(cfg: Config) -> bool:
    """Put a run DVC has not recorded (stopped, or finished while DVC was gone) back in place
    (a run found there instead, which the checkout of `dvc exp run` restored from DVC's
    cache, is moved aside: nothing is deleted). Returns whether there was one."""
    kept = _beside(cfg.paths.train_dir, PREEMPTED_SUFFIX)
    stash = checkpoint_dir(kept)
    if _rank() != 0 or not stash.is_dir() or not any(stash.iterdir()):
        return False
    step, record = kept_state(cfg.paths.train_dir)
    here = checkpoint_dir(cfg.paths.train_dir)
    # Links of a mirror to files still in place, or to copies of them (DVC copies a persist
    # output's files before it runs the stage again): nothing to move aside.
    for path in stash.iterdir():
        twin = here / path.name
        if twin.is_file() and (
            os.path.samefile(path, twin) or filecmp.cmp(path, twin, shallow=False)
        ):
            twin.unlink()
    finished = is_finished(step, record)
    _move_aside(
        Path(cfg.paths.train_dir),
        "the run found there is the one `dvc exp run` checked out",
        then=f"{'recording the finished' if finished else 'resuming the stopped'} run from {stash}",
    )
    at = f"step {step}" if step is not None and step >= 0 else "its newest checkpoint"
    moved = move_checkpoints(kept, here)
    if moved:
        what = (
            f"the finished run DVC has not recorded ({at}) is put back (recorded without "
            "training where this config and code made it)"
            if finished
            else f"the stopped run goes on from {at}"
        )
        print(
            f"{what}: moved its {len(moved)} checkpoint files back from {stash}",
            file=sys.stderr,
            flush=True,
        )
    return bool(moved)
