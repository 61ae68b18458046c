"""The val loss per target token of each step checkpoint of a run, as training now logs it.

    python -m benchmarks.checkpoint_val_loss models/train/checkpoints --tokenized data/tokenized \
        --out results/parity/diagnostics/<curve>.val_loss.tsv

Runs logged before `TokenMean` (pipeline/training/module.py) hold the mean of their validation
batches' means, not the loss per token. This re-validates every `step-*.ckpt` of a run with the
module's own validation step (Lightning's `Trainer.validate`, the config saved in the checkpoint,
its val split from `--tokenized`) and writes `step<TAB>loss` as dvclive does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli import main
from pipeline.training.checkpoints import step_checkpoints


def run_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's `step-<N>.ckpt` files, by step; none is an error naming it."""
    found = step_checkpoints(directory)
    if not found:
        raise SystemExit(f"{directory}: no step-<N>.ckpt checkpoints")
    return found


def val_loss(checkpoint: Path, tokenized: Path) -> float:
    import lightning as L
    import torch

    from pipeline.data.datamodule import TranslationDataModule
    from pipeline.training.module import TranslationModule

    # Explicit: an unset weights_only is what TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD overrides.
    module = TranslationModule.load_from_checkpoint(
        checkpoint, map_location="cpu", weights_only=True
    )
    module.cfg.train.val_bleu = False  # the loss alone
    module.cfg.paths.tokenized = str(tokenized)
    data = TranslationDataModule(module.cfg)
    data.setup("validate")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    with torch.inference_mode():
        (logged,) = trainer.validate(module, dataloaders=data.val_dataloader(), verbose=False)
    return float(logged["val/loss"])


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_val_loss",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("checkpoints", type=Path, help="a run's checkpoint folder")
    parser.add_argument("--tokenized", type=Path, default=Path("data/tokenized"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = ["step\tloss"]
    for step, path in run_checkpoints(args.checkpoints):
        rows.append(f"{step}\t{val_loss(path, args.tokenized)}")
        print(rows[-1], flush=True)
    args.out.write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(cli)
