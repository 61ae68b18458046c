"""Checkpoints: atomic saving, resume discovery, selection and averaging.

Layout of `<train_dir>/checkpoints/`:

    last.ckpt                                the newest state (what a resumed run continues from)
    step-0000500.ckpt ...                    the last `train.save_top_k` validations, by step
    best-step-0000500-bleu-12.3456.ckpt ...  the best `train.save_top_k` by val/greedy_bleu
                                             (`best-step-...-loss-2.3456` when val_bleu is off)
    progress.json                            the step and file of the newest save

A checkpoint names no absolute path of the machine it was written on: its saved config's
paths are written as `pipeline.portable_paths` writes records (relative to the repository, to
the work root, or to `~`), and the checkpoint callbacks name their files relative to their own
folder, so their state still holds where the folder is moved or copied.

Lightning's side (the checkpoint callback and the writer it saves through) is in
`pipeline.training.checkpoint_io`: this module does not import Lightning, so evaluating,
translating and exporting a checkpoint start without it.

Every file is written to a temporary name beside its target, fsynced and renamed over it
(`os.replace` is atomic on POSIX), so a killed process leaves either the old or the new file,
never half of one. Reading a checkpoint verifies the CRC-32 of each record of its archive, so
flipped bytes are an error, not silently wrong weights. `progress.json` records that
checkpoints were written: a run directory that recorded progress but holds no readable
checkpoint is an error, not a silent fresh start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import DataError
from pipeline.metric_names import GREEDY_VAL_BLEU
from pipeline.portable_paths import WORK_ROOT, relativize_tree

CHECKPOINT_DIR = "checkpoints"
LAST_NAME = "last.ckpt"
PROGRESS_NAME = "progress.json"
PRECISION_KEY = "precision"  # the entry naming the precision the run trained in
# The entry holding `source_hash()` of the code that wrote the checkpoint (its name in files)
SOURCE_HASH_KEY = "code_version"
WORLD_SIZE_KEY = "world_size"  # the processes that trained it: its global batch, its ranks' RNGs
MODEL_PREFIX = "model."  # the Transformer's weights in the training module's state_dict
ZIP_MAGIC = b"PK\x03\x04"  # the first bytes of every archive torch.save writes
CORRUPT_SUFFIX = ".corrupt"  # an unreadable checkpoint set aside by resume
STEP_TEMPLATE = "step-{step:07d}"  # ModelCheckpoint filename templates (".ckpt" is appended)
BEST_TEMPLATES = {
    GREEDY_VAL_BLEU: "best-step-{step:07d}-bleu-{val/greedy_bleu:.4f}",
    "val/loss": "best-step-{step:07d}-loss-{val/loss:.4f}",
}
_STEP_FILE = re.compile(r"^step-(?P<step>\d+)\.ckpt$")
_BEST_FILE = re.compile(
    r"^best-step-(?P<step>\d+)-(?P<metric>bleu|loss)-(?P<score>-?[\d.]+)\.ckpt$"
)
_VERSIONED_LAST = re.compile(r"^last-v\d+\.ckpt$")  # Lightning's name for a second last.ckpt
_REQUIRED_KEYS = ("state_dict", "global_step", "hyper_parameters")
HERE = "."  # a checkpoint callback's saved folder: the one its checkpoint lies in
CALLBACK_FILE_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def checkpoint_dir(train_dir: str | os.PathLike) -> Path:
    return Path(train_dir) / CHECKPOINT_DIR


def portable_config(tree: Any) -> Any:
    """A config (or any tree of its values) with its paths written as a checkpoint saves them:
    relative to the working folder, `<work-root>/...` or `~/...` (a copy)."""
    return relativize_tree(tree, Path.cwd(), WORK_ROOT)


def portable_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` with its saved config's paths written portably (a shallow copy: the
    module's own hyperparameters are not touched)."""
    saved = checkpoint.get("hyper_parameters")
    if not isinstance(saved, dict):
        return checkpoint
    return {**checkpoint, "hyper_parameters": portable_config(saved)}


def link_into(mirror: Path, *paths: Path) -> None:
    """Hard-link each of `paths` into `mirror` under its own name (a link of that name is
    replaced atomically: the mirror is never without a file it had). Nothing else in `mirror`
    changes."""
    mirror.mkdir(parents=True, exist_ok=True)
    for path in paths:
        target, tmp = mirror / path.name, mirror / f".{path.name}.link"
        try:
            if not (target.exists() and os.path.samefile(path, target)):
                tmp.unlink(missing_ok=True)
                os.link(path, tmp)
                os.replace(tmp, target)
        except FileNotFoundError:  # removed meanwhile (by another process)
            continue


def link_checkpoints(directory: Path, mirror: Path) -> None:
    """Hard-link every checkpoint and the progress record in `directory` into `mirror`."""
    link_into(mirror, *_checkpoint_files(directory), directory / PROGRESS_NAME)


def stash_checkpoints(train_dir: str | os.PathLike, mirror: Path) -> None:
    """Take a run's checkpoints (and progress record) out of `train_dir` into its `mirror`:
    a file linked there already leaves `train_dir`, one not there yet moves there, and one
    that differs from the mirror's of its name stays where it is (another run's, put there
    meanwhile: DVC checks its workspace out under a running stage). The mirror keeps what
    it has."""
    directory = checkpoint_dir(train_dir)
    if not directory.is_dir():
        return
    mirror.mkdir(parents=True, exist_ok=True)
    for path in [*_checkpoint_files(directory), directory / PROGRESS_NAME]:
        target = mirror / path.name
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            if not target.exists():
                shutil.move(str(path), target)
            elif os.path.samefile(path, target):
                path.unlink()


def verify_archive(path: str | os.PathLike) -> None:
    """Check the CRC-32 of every record of a checkpoint archive (torch.save's zip format), so
    that flipped bytes in tensor data are an error instead of silently wrong weights."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            head = file.read(len(ZIP_MAGIC))
        if head != ZIP_MAGIC:
            what = (
                "an empty file"
                if not head
                else "torch.save writes a zip archive; this file is not one"
            )
            raise DataError(f"{path}: not a checkpoint ({what}): give a checkpoint the train "
                            "stage wrote")  # fmt: skip
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path}: unreadable checkpoint ({type(err).__name__}: {err})") from None
    if damaged is not None:
        raise DataError(f"{path}: corrupt checkpoint (CRC mismatch in its record {damaged})")


def unsafe_globals(path: Path) -> list[str]:
    """The classes and functions a checkpoint's pickle names beyond what `torch.load(
    weights_only=True)` rebuilds (tensors, plain containers and numbers), read from its
    opcodes without running them ([] for a file torch cannot parse)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # a truncated or foreign file: not the question asked here
        return []


def load_error(
    path: Path, err: BaseException, failed: str = "unreadable checkpoint", hint: str = ""
) -> DataError:
    """The DataError for a checkpoint `torch.load(weights_only=True)` failed on: refused,
    naming what it would build, when its pickle holds objects (building them can run code);
    else `failed` with torch's reason."""
    unsafe = unsafe_globals(path) if isinstance(err, pickle.UnpicklingError) else []
    if unsafe:
        message = (
            f"{path}: refused: loading it would build {', '.join(unsafe)}, which can run code; "
            "checkpoints are loaded weights-only (tensors, plain containers and numbers). "
            "Use a checkpoint this pipeline wrote"
        )
    else:
        message = f"{path}: {failed} ({type(err).__name__}: {err})"
    return DataError(f"{message}; {hint}" if hint else message)


def load_weights_only(
    path: str | os.PathLike, failed: str = "unreadable checkpoint", hint: str = ""
) -> Any:
    """`torch.load` on the CPU that never runs code from the file: weights-only, with no
    global allowed beyond torch's own (the module saves its RNG states and hyperparameters
    as plain types, so the pipeline's checkpoints need none). DataError naming the file
    (`load_error`'s, with `failed` and `hint`)."""
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise load_error(path, err, failed, hint) from None


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint on the CPU (weights only) after verifying its checksums; a corrupt,
    truncated, foreign or code-carrying file raises DataError naming it."""
    path = Path(path)
    verify_archive(path)
    checkpoint = load_weights_only(path)
    missing = [
        key for key in _REQUIRED_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint
    ]
    if missing:
        raise DataError(f"{path}: not a training checkpoint (missing {', '.join(missing)})")
    return checkpoint


def _checkpoint_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.ckpt") if not p.name.startswith("."))


def step_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step-<N>.ckpt` in `directory` (the newest validations), by step."""
    found = ((_STEP_FILE.match(p.name), p) for p in _checkpoint_files(directory))
    return sorted((int(match["step"]), path) for match, path in found if match)


def _named_step(path: Path) -> int | None:
    """The step in a `step-*` or `best-step-*` file name (None for last.ckpt and others)."""
    match = _STEP_FILE.match(path.name) or _BEST_FILE.match(path.name)
    return int(match["step"]) if match else None


def _set_aside(paths: Sequence[Path]) -> list[Path]:
    """Rename unreadable checkpoints to `<name>.corrupt`: out of resume's and averaging's way,
    not deleted."""
    moved = []
    for path in paths:
        target = path.with_name(path.name + CORRUPT_SUFFIX)
        path.replace(target)
        moved.append(target)
    return moved


def fold_versioned_last(directory: Path) -> Path | None:
    """Make `last.ckpt` the newest of itself and the `last-v<N>.ckpt` files a resumed run of
    older code wrote beside it (Lightning versions a name it finds taken): the newest readable
    one by step is renamed `last.ckpt`, the older ones removed (earlier states of the same run,
    which its step checkpoints keep), unreadable ones set aside. Returns the file renamed."""
    versions = sorted(p for p in directory.glob("last-v*.ckpt") if _VERSIONED_LAST.match(p.name))
    if not versions:
        return None
    last, readable, unreadable = directory / LAST_NAME, [], []
    for path in [last, *versions] if last.exists() else versions:
        try:
            readable.append((int(read_checkpoint(path)["global_step"]), path != last, path))
        except DataError:
            unreadable.append(path)
    _set_aside([path for path in unreadable if path != last])
    newest = max(readable, default=None)
    for _, _, path in readable:
        if path not in (last, newest[2]):
            path.unlink()
    if newest is None or newest[2] == last:
        return None
    os.replace(newest[2], last)
    warnings.warn(f"{last}: the newest state (step {newest[0]}) was in {newest[2].name}; "
                  "renamed to last.ckpt", stacklevel=2)  # fmt: skip
    return newest[2]


def find_resume_checkpoint(train_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a resumed run continues from, or None for a fresh directory.

    The newest readable checkpoint by step: `last.ckpt`, unless a `step-*`/`best-*` file is
    newer (a run killed between writing them) or `last.ckpt` is unreadable. Unreadable files
    newer than the chosen one are renamed `*.corrupt`, with a warning. A directory whose files
    or `progress.json` show that training ran but that holds no readable checkpoint raises
    DataError: resuming would silently start over.
    """
    directory = checkpoint_dir(train_dir)
    if directory.is_dir():
        fold_versioned_last(directory)
    files = _checkpoint_files(directory) if directory.is_dir() else []
    progress_file = directory / PROGRESS_NAME
    last = directory / LAST_NAME
    problems, unreadable = [], []
    chosen: tuple[int, Path] | None = None
    if last in files:
        try:
            chosen = (int(read_checkpoint(last)["global_step"]), last)
        except DataError as err:
            problems.append(str(err))
            unreadable.append(last)
    named = sorted(
        ((step, path) for path in files if (step := _named_step(path)) is not None),
        reverse=True,
    )
    for step, path in named:
        if chosen is not None and step <= chosen[0]:
            break
        try:
            read_checkpoint(path)
        except DataError as err:
            problems.append(str(err))
            unreadable.append(path)
            continue
        chosen = (step, path)
        break
    if chosen is not None:
        step, path = chosen
        if path != last or unreadable:
            set_aside = _set_aside(unreadable)
            last_ok = last in files and last not in unreadable
            why = f"it is newer than {last}" if last_ok else f"{last} is missing or unreadable"
            warnings.warn(
                f"resuming from {path} (step {step}): {why}. "
                + " ".join(problems)
                + (f" Set aside: {', '.join(str(p) for p in set_aside)}." if set_aside else ""),
                stacklevel=2,
            )
        return path
    if problems or progress_file.exists():
        recorded = progress_file.read_text(encoding="utf-8") if progress_file.exists() else ""
        raise DataError(
            f"{directory}: training progress was recorded ({recorded.strip() or 'checkpoint files'}"
            f") but no readable checkpoint is left. {' '.join(problems)} Restore a checkpoint "
            "there, or start over: delete the directory or set train.resume=false."
        )
    return None


def source_hash() -> str:
    """A hash of the package's source: a finished run is only reused by the code that made it."""
    import pipeline

    digest = hashlib.sha256()
    root = Path(pipeline.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def move_checkpoints(train_dir: str | os.PathLike, destination: str | os.PathLike) -> list[Path]:
    """Move the checkpoints (and progress record) of a previous run into `destination`;
    returns where they went."""
    directory = checkpoint_dir(train_dir)
    if not directory.is_dir():
        return []
    files = [*_checkpoint_files(directory), directory / PROGRESS_NAME]
    files = [p for p in files if p.exists()]
    if not files:
        return []
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in files:
        moved.append(Path(shutil.move(str(path), destination / path.name)))
    return moved


def remove_checkpoints(train_dir: str | os.PathLike) -> list[Path]:
    """Delete the checkpoints (and progress record) of a run kept elsewhere byte for byte;
    returns what went."""
    directory = checkpoint_dir(train_dir)
    if not directory.is_dir():
        return []
    files = [p for p in (*_checkpoint_files(directory), directory / PROGRESS_NAME) if p.exists()]
    for path in files:
        path.unlink()
    return files


def select_checkpoints(train_dir: str | os.PathLike, n: int, by: str = "last") -> list[Path]:
    """The checkpoints to average: the `n` newest (`by="last"`, by step) or the `n` best
    (`by="best"`, by the validation score in the file name). Newest/best first.
    Fewer than `n` available gives a warning and all of them; none is a DataError."""
    if by not in ("last", "best"):
        raise ValueError(f"by must be 'last' or 'best', got {by!r}")
    directory = checkpoint_dir(train_dir)
    # A missing folder globs to nothing: the DataError below names it.
    ranked: list[tuple[tuple, Path]] = []
    if by == "last":
        ranked = [((step,), path) for step, path in step_checkpoints(directory)]
    else:
        for path in _checkpoint_files(directory):
            if match := _BEST_FILE.match(path.name):
                score = float(match["score"])
                better = score if match["metric"] == "bleu" else -score  # loss: lower is better
                ranked.append(((better, int(match["step"])), path))
    if not ranked:
        raise DataError(
            f"{directory}: no {'step-*' if by == 'last' else 'best-*'}.ckpt checkpoints to "
            "select; run the train stage first (or check paths.train_dir)"
        )
    ranked.sort(key=lambda item: item[0], reverse=True)
    if len(ranked) < n:
        warnings.warn(
            f"{directory}: asked for the {by} {n} checkpoints, only {len(ranked)} exist; "
            "using all of them (raise train.save_top_k to keep more)",
            stacklevel=2,
        )
    return [path for _, path in ranked[:n]]


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' floating-point tensors (summed in float64,
    returned in their own dtype); other tensors (integer buffers) are taken from the last path.
    Keys are the LightningModule's (`model.*`)."""
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    first = Path(paths[0])
    sums: dict[str, torch.Tensor] = {}
    averaged: dict[str, torch.Tensor] = {}
    for path in paths:
        state = read_checkpoint(path)["state_dict"]
        if averaged and state.keys() != averaged.keys():
            differing = ", ".join(sorted(set(state) ^ set(averaged))[:5])
            raise DataError(
                f"{path}: its parameters differ from those of {first} ({differing}); "
                "only checkpoints of one model can be averaged"
            )
        for key, tensor in state.items():
            averaged[key] = tensor
            if not tensor.is_floating_point():
                continue
            if key in sums and sums[key].shape != tensor.shape:
                raise DataError(
                    f"{path}: {key} has shape {tuple(tensor.shape)} but "
                    f"{tuple(sums[key].shape)} in {first}; only checkpoints of one model "
                    "can be averaged"
                )
            sums[key] = sums[key] + tensor.double() if key in sums else tensor.double()
    for key, total in sums.items():
        averaged[key] = (total / len(paths)).to(averaged[key].dtype)
    return averaged
