"""Translate sentences with the trained model: one line in, one line out.

    echo "A man is riding a bike." | python -m pipeline.translate
    python -m pipeline.translate --input news.en --output news.de --beam 5

Input is normalised exactly as `prepare` normalises the corpus (NFC, whitespace collapsed),
encoded with the joint subword model (Moses-tokenized first where the model was trained so,
`data.tokenizer.pretokenizer`), beam-searched in batches of `eval.max_tokens` source tokens and
detokenized; an empty input line gives an empty output line. Defaults come from
params.yaml: the model is `paths.eval_dir/model.ckpt` (the averaged checkpoint the evaluate
stage scored), the subword model `paths.tokenized/spm.model`, beam settings from `eval`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pipeline import config as config_lib
from pipeline.cli import main
from pipeline.data.corpus import normalize, read_lines
from pipeline.data.tokenizer import MODEL_FILE
from pipeline.errors import DataError
from pipeline.evaluation import MODEL_CHECKPOINT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.translate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--params", default="params.yaml", help="config (default: params.yaml)")
    parser.add_argument(
        "--checkpoint", type=Path, help="model checkpoint (default: <paths.eval_dir>/model.ckpt)"
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="sentencepiece model (default: <paths.tokenized>/spm.model)"
    )
    parser.add_argument("--beam", type=_positive_int, help="beam size (default: eval.beam_size)")
    parser.add_argument(
        "--input", type=Path, help="source text, one sentence a line (default: stdin)"
    )
    parser.add_argument("--output", type=Path, help="where translations go (default: stdout)")
    return parser.parse_args(argv)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def translate(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = config_lib.load(args.params)
    default_checkpoint = Path(cfg.paths.eval_dir) / MODEL_CHECKPOINT
    checkpoint = args.checkpoint or default_checkpoint
    if not checkpoint.is_file():
        raise DataError(
            f"checkpoint {checkpoint} not found: train and evaluate with `dvc repro evaluate` "
            f"(it runs `dvc repro train` first and writes {default_checkpoint}), "
            f"or pass --checkpoint {Path(cfg.paths.train_dir) / 'checkpoints'}/<name>.ckpt"
        )
    spm_model = args.tokenizer or Path(cfg.paths.tokenized) / MODEL_FILE
    if not spm_model.is_file():
        raise DataError(
            f"tokenizer {spm_model} not found: create it with `dvc repro tokenize`, "
            "or pass --tokenizer PATH/spm.model"
        )
    eval_cfg = dataclasses.replace(cfg.eval, nbest=1, beam_size=args.beam or cfg.eval.beam_size)

    lines = read_lines(args.input) if args.input is not None else read_stdin_lines()
    sources = [normalize(line) for line in lines]

    # torch and the model code load only now: a usage error above answers at once.
    from pipeline.evaluation.evaluate import load_model, load_tokenizer, translate_ids

    model = load_model(checkpoint)
    tokenizer = load_tokenizer(spm_model, model, cfg.data)
    translations = translate_ids(
        model, tokenizer, tokenizer.encode_sources(sources), eval_cfg, desc="translate"
    )
    text = "".join(f"{t.best}\n" for t in translations)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:  # UTF-8 whatever the locale says
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.flush()


def read_stdin_lines() -> list[str]:
    """Lines of standard input, decoded as UTF-8 (like the corpus files), split at "\\n"."""
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(
            f"<stdin>:{line}: invalid UTF-8 at byte offset {err.start}; send UTF-8 text"
        ) from None
    lines = text.removeprefix("\ufeff").split("\n")  # a byte-order mark is not text
    if lines[-1] == "":
        lines.pop()
    return lines


if __name__ == "__main__":
    main(lambda: translate(sys.argv[1:]))
