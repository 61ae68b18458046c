"""subword-nmt's joint BPE inside the pipeline, against subword-nmt's own command line as the
Multi30k dataset's task1-bpe.sh runs it (a separate process: its own hash seed, its own files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.data.moses import moses_tokenize
from pipeline.data.prepared import read_prepared
from pipeline.data.subword_nmt import SubwordNmt, codes_path, join, vocab_path
from pipeline.errors import DataError

MERGES = 500  # the smoke corpus's 2000 pairs run out of pairs seen twice near 2000


def task1_bpe(train: tuple[list[str], list[str]], texts: dict[str, list[str]], merges: int,
              folder: Path) -> tuple[str, dict[str, str], dict[str, list[str]]]:  # fmt: skip
    """task1-bpe.sh through the `subword-nmt` command: the codes, each side's vocabulary, and
    `texts` ({side: lines}) as `apply-bpe -c codes --vocabulary vocab.<side>` writes them."""
    command = [str(Path(sys.executable).with_name("subword-nmt"))]
    for side, lines in zip(("src", "tgt"), train):
        (folder / f"train.{side}").write_text("".join(f"{line}\n" for line in lines), "utf-8")
    subprocess.run([*command, "learn-joint-bpe-and-vocab", "--input", "train.src", "train.tgt",
                    "-s", str(merges), "-o", "codes",
                    "--write-vocabulary", "vocab.src", "vocab.tgt"],
                   cwd=folder, check=True, capture_output=True, timeout=300)  # fmt: skip
    applied = {}
    for side, lines in texts.items():
        done = subprocess.run(
            [*command, "apply-bpe", "-c", "codes", "--vocabulary", f"vocab.{side}"],
            cwd=folder, input="".join(f"{line}\n" for line in lines), text=True,
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        applied[side] = done.stdout.split("\n")[:-1]
    vocabularies = {side: (folder / f"vocab.{side}").read_text("utf-8") for side in ("src", "tgt")}
    return (folder / "codes").read_text("utf-8"), vocabularies, applied


@pytest.fixture(scope="module")
def moses_text(tokenized_smoke):
    """The smoke corpus's train and val splits lowercased and Moses-tokenized (task1-tokenize.sh)."""
    corpus = read_prepared(tokenized_smoke)
    return {
        split: (moses_tokenize(corpus[split].src, "en"), moses_tokenize(corpus[split].tgt, "de"))
        for split in ("train", "val")
    }


def test_learn_and_segment_equal_the_subword_nmt_command_line(moses_text, tmp_path):
    train, val = moses_text["train"], moses_text["val"]
    codes, vocabularies, applied = task1_bpe(
        train, {"src": val[0] + train[0][:50], "tgt": val[1]}, MERGES, tmp_path
    )
    learned = SubwordNmt.learn(*train, MERGES)
    assert learned.codes == codes
    assert learned.vocabularies == vocabularies
    assert len(codes.splitlines()) == MERGES + 1  # the version line, then every merge
    assert learned.sources(val[0] + train[0][:50]) == applied["src"]
    assert learned.targets(val[1]) == applied["tgt"]
    # The vocabularies undo merges into pieces a side never had: the sides segment apart.
    assert learned.sources(val[1]) != applied["tgt"]


def test_join_restores_the_tokenized_text(moses_text):
    train, val = moses_text["train"], moses_text["val"]
    learned = SubwordNmt.learn(*train, MERGES)
    segmented = learned.targets(val[1])
    assert [join(line) for line in segmented] == val[1]
    pieces = [piece for line in segmented for piece in line.split()]
    assert sum(piece.endswith("@@") for piece in pieces) > 0.1 * len(pieces)
    assert join("ein hund@@ e@@ hütte .") == "ein hundehütte ."
    # fairseq's --remove-bpe: a trailing joiner goes too, text without joiners stays
    assert join("ein sch@@ war@@ zer hund@@ ") == "ein schwarzer hund"
    assert join("ein hund .") == "ein hund ."


def test_written_beside_a_model_and_read_back(moses_text, tmp_path):
    learned = SubwordNmt.learn(*moses_text["train"], MERGES)
    model = tmp_path / "spm.model"
    assert SubwordNmt.read(model) is None  # no merges: no subword-nmt
    learned.write(model)
    assert codes_path(model) == tmp_path / "spm.bpe-codes"
    read = SubwordNmt.read(model)
    assert (read.codes, read.vocabularies) == (learned.codes, learned.vocabularies)
    codes_path(model).write_text("#version: 0.2\nth e r\n", encoding="utf-8")  # three units
    with pytest.raises(DataError, match=r"spm\.bpe-codes or the vocabularies beside it: not"):
        SubwordNmt.read(model)
    learned.write(model)
    vocab_path(model, "src").write_text("the\n", encoding="utf-8")  # no count
    with pytest.raises(DataError, match=r"not subword-nmt's files"):
        SubwordNmt.read(model)
    vocab_path(model, "tgt").unlink()
    with pytest.raises(DataError, match=r"spm\.bpe-vocab\.tgt: missing beside .*spm\.bpe-codes"):
        SubwordNmt.read(model)
