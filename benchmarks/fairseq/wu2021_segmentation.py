"""Wu et al.'s exact subword segmentation, for our pipeline: is the parity gap the data or the training?

Ours (sentencepiece BPE) and fairseq (subword-nmt BPE, `benchmarks.fairseq.train_peer`) split the same
Moses-tokenized lowercased text into different subwords, so their validation losses per subword
are not comparable, and a BLEU gap between them may come from the segmentation. This writes the
text fairseq trains on, made by train_peer's own `prepare` and `bpe` stages (task1-tokenize.sh,
then subword-nmt with 10000 joint merges), and prints the `dvc exp run` overrides under which our
pipeline trains on exactly those subwords: `data.source=text` on the segmented files, no further
pre-tokenization, and a sentencepiece `word` model that maps each subword to one id (its
vocabulary is the subword types of the training text, as fairseq-preprocess's joined dictionary).

    python -m benchmarks.fairseq.wu2021_segmentation --venv VENV    # VENV/bin/subword-nmt; prints overrides
    dvc exp run -S experiment=multi30k_wu2021 <the printed overrides> train

Only the training and its validation loss are comparable this way: the evaluate stage would
score text that still carries subword-nmt's `@@ ` joiners (`benchmarks.fairseq.decode_checkpoint` scores
such runs as the harness scores fairseq). The preset itself now segments the same way inside
the pipeline (`data.tokenizer.model_type: subword_nmt`, `pipeline.data.subword_nmt`), and its
evaluate stage scores it; this stays for reading the harness's own files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.fairseq import train_peer
from pipeline.cli import main
from pipeline.config_schema import TokenizerConfig
from pipeline.data.tokenizer import word_vocab_size

# train_peer's subsets -> our split names (conf/data/multi30k.yaml)
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def vocab_size(files: list[Path]) -> int:
    """One id per subword of `files` and the specials of our tokenizer's defaults (fairseq's
    joined dictionary), as the tokenize stage counts them under subword_nmt."""
    lines = [line for path in files for line in path.read_text(encoding="utf-8").splitlines()]
    return word_vocab_size(lines, TokenizerConfig())


def overrides(args: argparse.Namespace, layout: train_peer.Layout) -> list[str]:
    """`dvc exp run -S` values that make our pipeline read the segmented files as they are."""
    values = ["data.source=text"]
    for subset, split in SPLITS.items():
        for side, lang in (("src", args.src), ("tgt", args.tgt)):
            values.append(f"+data.text_files.{split}.{side}={layout.bpe_file(subset, lang)}")
    train = [layout.bpe_file("train", lang) for lang in (args.src, args.tgt)]
    return values + [
        "data.tokenizer.pretokenizer=none",  # already Moses-tokenized and lowercased
        "data.tokenizer.case_fold=false",
        "data.tokenizer.model_type=word",
        f"data.tokenizer.vocab_size={vocab_size(train)}",
    ]


def cli(argv: list[str] | None = None) -> None:
    args = train_peer.build_parser().parse_args(argv)
    layout = train_peer.Layout(args.work_dir)
    layout.logs.mkdir(parents=True, exist_ok=True)
    settings = train_peer.data_settings(args)
    if not train_peer.stage_done(layout.tok, settings):  # as a train_peer run left it
        train_peer.prepare(args, layout, settings)
    train_peer.fresh_dir(layout.bpe)  # train_peer redoes it (its mark names its venv)
    env = train_peer.tool_env(args)
    with open(layout.logs / "bpe.log", "a") as log:
        for command, stdin, stdout in train_peer.bpe_commands(args, layout):
            train_peer.run_command(command, env, log, stdin=stdin, stdout=stdout)
    print(f"segmented text in {layout.bpe}", file=sys.stderr)
    print(" ".join(f"-S '{value}'" for value in overrides(args, layout)))


if __name__ == "__main__":
    main(cli)
