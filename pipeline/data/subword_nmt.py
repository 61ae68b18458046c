"""Joint byte-pair encoding as subword-nmt learns and applies it (Sennrich et al. 2016, "Neural
Machine Translation of Rare Words with Subword Units", section 3.2): the segmentation of the
Multi30k dataset's scripts/task1-bpe.sh, which Wu et al. (2021) and fairseq's recipe train on
(`data.tokenizer.model_type: subword_nmt`).

    subword-nmt learn-joint-bpe-and-vocab --input train.SRC train.TGT -s MERGES -o codes \\
        --write-vocabulary vocab.SRC vocab.TGT
    subword-nmt apply-bpe -c codes --vocabulary vocab.L < file.L     (each file, its language's)

= `SubwordNmt.learn(sources, targets, merges)`, then `.sources(lines)` / `.targets(lines)`, on
text already pre-tokenized (`pipeline.data.tokenizer.Pretokenizer`). Every piece of a word but
its last ends with the joiner `@@`; `join` removes them as fairseq's `--remove-bpe` does. The
vocabularies make apply-bpe undo a merge whose piece never occurred in that language's segmented
training text, so val and test sentences are made of pieces the model has seen.

The codes and both vocabularies are kept beside the subword model (`spm.bpe-codes`,
`spm.bpe-vocab.src`, `spm.bpe-vocab.tgt` beside spm.model), so every loader of the model
segments as the tokenize stage did.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from subword_nmt.apply_bpe import BPE, read_vocabulary
from subword_nmt.learn_joint_bpe_and_vocab import learn_joint_bpe_and_vocab

from pipeline.errors import DataError

JOINER = "@@"  # subword-nmt's --separator default, which task1-bpe.sh keeps
CODES_SUFFIX = ".bpe-codes"  # spm.bpe-codes beside spm.model
VOCAB_SUFFIX = ".bpe-vocab.{side}"  # spm.bpe-vocab.src / .tgt: counts after segmentation
SIDES = ("src", "tgt")


def codes_path(model_path: str | os.PathLike) -> Path:
    """Where the merges of the subword model at `model_path` are kept (none: no subword-nmt)."""
    return Path(model_path).with_suffix(CODES_SUFFIX)


def vocab_path(model_path: str | os.PathLike, side: str) -> Path:
    return Path(model_path).with_suffix(VOCAB_SUFFIX.format(side=side))


def join(text: str) -> str:
    """`text` with subword-nmt's joiners removed (fairseq's `--remove-bpe`:
    `(line + ' ').replace('@@ ', '').rstrip()`)."""
    return (text + " ").replace(JOINER + " ", "").rstrip()


@dataclass
class SubwordNmt:
    """Learned merges (subword-nmt's codes file) and each side's vocabulary file, as text."""

    codes: str
    vocabularies: dict[str, str]  # side -> "piece count" lines
    _segmenters: dict[str, BPE] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for side in SIDES:
            vocabulary = read_vocabulary(io.StringIO(self.vocabularies[side]), None)
            self._segmenters[side] = BPE(io.StringIO(self.codes), vocab=vocabulary)

    @classmethod
    def learn(cls, sources: Sequence[str], targets: Sequence[str], merges: int) -> SubwordNmt:
        """`learn-joint-bpe-and-vocab` on the pre-tokenized training text: `merges` merges
        learned on both sides' words together, each side's vocabulary counted after them."""
        with tempfile.TemporaryDirectory(prefix="subword-nmt-") as folder:
            root = Path(folder)
            inputs = [root / f"train.{side}" for side in SIDES]
            for path, lines in zip(inputs, (sources, targets)):
                path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            vocabs = [root / f"vocab.{side}" for side in SIDES]
            codes = root / "codes"
            # its own function, as its command line calls it; it reopens every file by name
            with contextlib.ExitStack() as files:
                learn_joint_bpe_and_vocab(
                    argparse.Namespace(
                        input=[
                            files.enter_context(open(path, encoding="utf-8")) for path in inputs
                        ],
                        output=files.enter_context(open(codes, "w", encoding="utf-8")),
                        vocab=[
                            files.enter_context(open(path, "w", encoding="utf-8"))
                            for path in vocabs
                        ],
                        symbols=merges,
                        separator=JOINER,
                        min_frequency=2,  # its default: stop where no pair occurs twice
                        total_symbols=False,
                        num_workers=1,
                        verbose=False,
                    )
                )
            return cls(
                codes.read_text(encoding="utf-8"),
                {side: path.read_text(encoding="utf-8") for side, path in zip(SIDES, vocabs)},
            )

    @classmethod
    def read(cls, model_path: str | os.PathLike) -> SubwordNmt | None:
        """The codes and vocabularies kept beside `model_path`; None where there are none."""
        codes = codes_path(model_path)
        if not codes.is_file():
            return None
        paths = {side: vocab_path(model_path, side) for side in SIDES}
        for path in paths.values():
            if not path.is_file():
                raise DataError(f"{path}: missing beside {codes}; re-run `dvc repro tokenize`")
        try:
            return cls(
                codes.read_text(encoding="utf-8"),
                {side: path.read_text(encoding="utf-8") for side, path in paths.items()},
            )
        except (SystemExit, ValueError):  # subword-nmt exits on a malformed codes line
            raise DataError(
                f"{codes} or the vocabularies beside it: not subword-nmt's files; "
                "re-run `dvc repro tokenize`"
            ) from None

    def write(self, model_path: str | os.PathLike) -> None:
        codes_path(model_path).write_text(self.codes, encoding="utf-8")
        for side, text in self.vocabularies.items():
            vocab_path(model_path, side).write_text(text, encoding="utf-8")

    def sources(self, lines: Sequence[str]) -> list[str]:
        """Pre-tokenized source lines as `apply-bpe` with the source vocabulary writes them."""
        return [self._segmenters["src"].segment(line) for line in lines]

    def targets(self, lines: Sequence[str]) -> list[str]:
        return [self._segmenters["tgt"].segment(line) for line in lines]
