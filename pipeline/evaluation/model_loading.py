"""The model the evaluate stage scores, and any checkpoint loaded back as a model.

Checkpoint averaging (Vaswani et al. 2017, section 6.1: "averaging the last 5 checkpoints")
smooths the end of training: `eval.checkpoint`, or the last/best `eval.average` checkpoints of
training, checked against the params they are scored under, are averaged into
`eval_dir/model.ckpt`, a Lightning checkpoint without optimizer state, which is also the model
`pipeline.translate` uses by default. `load_model` reads any training checkpoint or model.ckpt
as the Transformer alone (no Lightning), and `load_tokenizer` the subword model it reads and
writes with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from pipeline.atomic import atomic_write
from pipeline.config_schema import Config, DataConfig
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import DataError, not_a_file
from pipeline.evaluation.outputs import MODEL_CHECKPOINT

TRAIN_HINT = "run `dvc repro train` (or `python -m pipeline.stages.train`) first"
# What model.ckpt keeps of a training checkpoint (optimizer and loop states are dropped).
CHECKPOINT_KEYS = (
    "state_dict",
    "hyper_parameters",
    "pytorch-lightning_version",
    "global_step",
    "epoch",
)


def model_checkpoint_path(cfg: Config) -> Path:
    """`eval_dir/model.ckpt`: the weights the evaluate stage scored (and translate uses)."""
    return Path(cfg.paths.eval_dir) / MODEL_CHECKPOINT


def source_checkpoints(cfg: Config) -> list[Path]:
    """`eval.checkpoint` when set, else the last/best `eval.average` checkpoints of training
    (newest/best first; fewer than asked for is a warning, none a DataError)."""
    from pipeline.training.checkpoints import select_checkpoints

    if cfg.eval.checkpoint:
        path = Path(cfg.eval.checkpoint)
        if problem := not_a_file(path):
            raise DataError(
                f"eval.checkpoint={path} {problem}; point it at a checkpoint under "
                f"{Path(cfg.paths.train_dir) / 'checkpoints'} or set it to null"
            )
        return [path]
    return select_checkpoints(cfg.paths.train_dir, cfg.eval.average, by=cfg.eval.average_by)


def check_trained_with(sources: Sequence[Path], cfg: Config) -> None:
    """Refuse checkpoints that another config made (params.yaml changed after the train stage
    ran, or under it): their scores would be recorded under parameters they were not trained
    with. Keys that cannot change the weights (RESUME_FREE_KEYS) may differ."""
    from pipeline.training.resume import check_same_run

    for path in sources:
        check_same_run(
            path,
            cfg,
            "These are not the checkpoints of the run the params describe: run the train "
            "stage first (`dvc repro`), or restore the value(s).",
        )


def write_model_checkpoint(sources: Sequence[Path], target: Path) -> dict:
    """Save the average of `sources` (or the single one) as a slim Lightning checkpoint:
    the hyperparameters of the first (newest/best) source, no optimizer state."""
    from pipeline.training.checkpoints import average_checkpoints, read_checkpoint

    first = read_checkpoint(sources[0])
    checkpoint = {key: first[key] for key in CHECKPOINT_KEYS if key in first}
    if len(sources) > 1:
        checkpoint["state_dict"] = average_checkpoints(list(sources))
    checkpoint["averaged_from"] = [str(path) for path in sources]
    # Into an open file: a full disk is then an OSError naming no torch internals.
    atomic_write(target, lambda f: torch.save(checkpoint, f))
    return checkpoint


def load_model(checkpoint: str | Path) -> torch.nn.Module:
    """The Transformer of a training (or `model.ckpt`) checkpoint, in eval mode on the CPU."""
    from pipeline.config import from_dict
    from pipeline.kernels import SpeedPaths, install_speed_paths
    from pipeline.model.transformer import build_transformer
    from pipeline.training.checkpoints import (
        MODEL_PREFIX,
        load_error,
        load_weights_only,
        verify_archive,
    )

    checkpoint = Path(checkpoint)
    if problem := not_a_file(checkpoint):
        raise DataError(f"checkpoint {checkpoint} {problem}; {TRAIN_HINT}")
    verify_archive(checkpoint)  # a zip of intact records: torch alone loads flipped bytes
    # Weights only: a checkpoint is user input, and unpickling anything else can run code.
    saved = load_weights_only(checkpoint, "not a checkpoint (torch cannot read it)")
    if not isinstance(saved, dict) or not {"hyper_parameters", "state_dict"} <= saved.keys():
        holds = (f"its keys: {', '.join(map(str, list(saved)[:5]))}" if isinstance(saved, dict)
                 else f"it holds a {type(saved).__name__}")  # fmt: skip
        raise DataError(
            f"{checkpoint}: not a checkpoint of a training run ({holds}, no hyper_parameters "
            "and state_dict): give a checkpoint the train stage wrote or the evaluate stage's "
            "model.ckpt"
        )
    failed = "cannot load the model"
    try:
        # The model's weights are the training module's under `model.`; the module's other
        # entries (optimizer, history) are not needed to translate, nor is Lightning.
        hyper = saved["hyper_parameters"]
        cfg = from_dict(hyper["config"])
        model = build_transformer(cfg, hyper["vocab_size"])  # then the paths training took
        install_speed_paths(model, SpeedPaths.on_cpu(cfg.runtime.cpu_speed_paths))
        weights = {name.removeprefix(MODEL_PREFIX): value
                   for name, value in saved["state_dict"].items() if name.startswith(MODEL_PREFIX)}  # fmt: skip
        model.load_state_dict(weights)  # strict: every weight of the model, nothing else
    except Exception as err:  # a foreign file's contents fail in many ways
        raise load_error(checkpoint, err, failed) from None
    return model.float().eval()


def load_tokenizer(
    path: str | Path, model: torch.nn.Module | None = None, data: DataConfig | None = None
) -> Tokenizer:
    """The subword model at `path`, checked against the model's vocabulary size; with `data`
    (the config the model was trained with) reading and writing text as it did: its source
    eos and pre-tokenization (`Tokenizer.for_data`)."""
    tokenizer = Tokenizer.load(path) if data is None else Tokenizer.for_data(path, data)
    if model is not None and model.vocab_size != tokenizer.vocab_size:
        raise DataError(
            f"{path}: vocabulary of {tokenizer.vocab_size} pieces but the model was trained "
            f"with {model.vocab_size}; use the tokenizer the model was trained with (after "
            "`dvc repro tokenize`, re-run `dvc repro train`)"
        )
    return tokenizer


def tokenizer_path(cfg: Config) -> Path:
    """`paths.tokenized/spm.model`: the tokenize stage's joint subword model."""
    return Path(cfg.paths.tokenized) / MODEL_FILE
