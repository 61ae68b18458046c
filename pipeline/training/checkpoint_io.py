"""Lightning's side of checkpoints (`pipeline.training.checkpoints` has the layout and the
rest): the checkpoint callback, whose state names its files relative to its folder, and the
writer Lightning saves through, atomic and recording each save in `progress.json`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from pipeline.atomic import atomic_write
from pipeline.training.checkpoints import (
    CALLBACK_FILE_KEYS,
    HERE,
    PROGRESS_NAME,
    link_into,
    portable_checkpoint,
)


class PortableModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, its state naming its files relative to its folder: the
    folder is saved as "." and each file by its name. Loaded, the names resolve against the
    folder the callback writes to now, so a run moved aside and back, or copied to another
    machine, keeps its best-k bookkeeping (Lightning drops it when the saved folder differs).
    A file of the same name is replaced, never versioned: a resumed run whose `last.ckpt` the
    callback did not write itself (a stop before its first save) would otherwise go on in
    `last-v1.ckpt` and leave `last.ckpt` at the stop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"enable_version_counter": False, **kwargs})

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's own key: checkpoints saved before this class resume as before
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        folder = Path(self.dirpath) if self.dirpath else None

        def name(path: str) -> str:
            return Path(path).name if folder and path and Path(path).parent == folder else path

        state.update({key: name(state[key]) for key in CALLBACK_FILE_KEYS})
        state["best_k_models"] = {name(path): score
                                  for path, score in state["best_k_models"].items()}  # fmt: skip
        state["dirpath"] = HERE if folder else state["dirpath"]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == HERE and self.dirpath:

            def path(name: str) -> str:
                return os.path.join(self.dirpath, name) if name and os.sep not in name else name

            state_dict = {
                **state_dict,
                "dirpath": self.dirpath,
                **{key: path(state_dict.get(key, "")) for key in CALLBACK_FILE_KEYS},
                "best_k_models": {path(name): score
                                  for name, score in state_dict["best_k_models"].items()},
            }  # fmt: skip
        super().load_state_dict(state_dict)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made crash-safe (temp file + fsync + `os.replace`), and
    recording each save in `progress.json` beside the checkpoints. With `mirror`, a folder
    on the same file system, every save and removal is mirrored there by hard links (no
    copy): the run survives a deletion of its folder, however abrupt its end. Only the
    run's own saves go there: a file another process puts in its folder (DVC's checkout of
    its workspace under a running stage) never replaces one of the run's."""

    def __init__(self, mirror: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.mirror = Path(mirror) if mirror is not None else None

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().remove_checkpoint(path)
        if self.mirror is not None:
            (self.mirror / Path(path).name).unlink(missing_ok=True)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options=None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        path = Path(path)
        checkpoint = portable_checkpoint(checkpoint)
        atomic_write(path, lambda f: torch.save(checkpoint, f))
        progress = {"step": int(checkpoint.get("global_step", 0)), "file": path.name}
        atomic_write(path.parent / PROGRESS_NAME, lambda f: f.write(json.dumps(progress).encode()))
        if self.mirror is not None:
            link_into(self.mirror, path, path.parent / PROGRESS_NAME)
