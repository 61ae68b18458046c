"""Export a trained model for use outside the pipeline: CTranslate2 (a C++ inference engine).

    python -m pipeline.export --to ctranslate2 --checkpoint eval/model.ckpt \\
        --tokenizer data/tokenized/spm.model --out exported/ct2 [--quantization int8]

Every file and value of the command line is checked before any model is loaded; what the folder
holds and how it translates: `pipeline.export`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.atomic import refuse_replacing
from pipeline.cli import main
from pipeline.data.tokenizer import MODEL_FILE
from pipeline.errors import ConfigError, DataError, not_a_file
from pipeline.export.conversion import (
    DEFAULT_QUANTIZATION,
    check_tokenizer,
    ctranslate2_module,
    export_ctranslate2,
)

FORMATS = ("ctranslate2",)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.export", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--to", choices=FORMATS, default=FORMATS[0], help="export format")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="model checkpoint, e.g. eval/model.ckpt (the averaged model)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help=f"the sentencepiece model it was trained with (data/tokenized/{MODEL_FILE})",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--quantization",
        default=DEFAULT_QUANTIZATION,
        help="stored weight type: float32, int8, float16, bfloat16, int16, "
        "int8_float32, int8_float16, int8_bfloat16 (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    parser.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="the workspace's params, whose stage outputs --out must not hold",
    )
    return parser.parse_args(argv)  # fmt: skip


def check_arguments(args: argparse.Namespace) -> None:
    """Every file and value of the command line, before any model is loaded."""
    if problem := not_a_file(args.checkpoint):
        raise DataError(
            f"checkpoint {args.checkpoint} {problem}: `dvc repro evaluate` writes the averaged "
            "model eval/model.ckpt; or pass a training checkpoint (models/train/checkpoints/)"
        )
    if not args.tokenizer.is_file():
        raise DataError(
            f"tokenizer {args.tokenizer} not found: `dvc repro tokenize` writes "
            f"data/tokenized/{MODEL_FILE}"
        )
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())) and not args.force:
        raise DataError(f"--out {args.out} exists and is not an empty folder; --force replaces it")
    refuse_replacing(args.out, out_keeps(args), name="--out")
    ctranslate2 = ctranslate2_module()
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if args.quantization not in ACCEPTED_MODEL_TYPES:
        raise ConfigError(
            f"--quantization {args.quantization}: CTranslate2 {ctranslate2.__version__} "
            f"stores {', '.join(ACCEPTED_MODEL_TYPES)}"
        )


def out_keeps(args: argparse.Namespace) -> dict:
    """What `--out` must not hold (it is replaced whole): the command's inputs and every stage
    output of the workspace's params.yaml."""
    from pipeline.config import load_paths

    inputs = {"--checkpoint": args.checkpoint, "--tokenizer": args.tokenizer}
    return {**inputs, **load_paths(args.params).outputs()}


def load_checkpoint(path: str | Path):
    """(the Transformer in eval mode on the CPU, the Config it was trained with)."""
    from pipeline.config import from_dict
    from pipeline.evaluation.model_loading import load_model
    from pipeline.training.checkpoints import read_checkpoint

    model = load_model(path)  # DataError naming the file if it is no model checkpoint
    return model, from_dict(read_checkpoint(path)["hyper_parameters"]["config"])


def export(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    check_arguments(args)
    from pipeline.evaluation.model_loading import load_tokenizer

    model, cfg = load_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(args.tokenizer, model, cfg.data)
    check_tokenizer(tokenizer, model.vocab_size, args.tokenizer)
    out = export_ctranslate2(
        model, tokenizer, args.out, quantization=args.quantization,
        provenance={"checkpoint": str(args.checkpoint)}, keep=out_keeps(args),
    )  # fmt: skip
    print(f"wrote {out}: CTranslate2 model, {args.quantization} weights", file=sys.stderr)
    return out


def console() -> None:
    """The `transformer-export` command (pyproject.toml)."""
    main(lambda: export(sys.argv[1:]))


if __name__ == "__main__":
    console()
