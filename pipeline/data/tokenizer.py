"""Joint subword vocabulary (sentencepiece BPE or unigram, or subword-nmt's BPE): train, encode,
decode. The `tokenize` stage that trains it and turns the prepared text into Arrow splits of
token ids is `pipeline.data.tokenized`.

One model is shared by source and target (section 3.4 of the paper ties their embeddings),
trained on the training split only (source + target lines), never on val/test.
Training is deterministic: the same prepared text gives a byte-identical `spm.model`
(one thread, every sentence used in file order, no sampling, a fixed random seed).
The text is already NFC/whitespace-normalised by `prepare`, so sentencepiece's own
normalisation is switched off (`identity`) and decode(encode(x)) == x for every sentence whose
characters are in the vocabulary (all of them with character_coverage=1.0). With
`data.tokenizer.case_fold` the model instead folds case (sentencepiece's `nfkc_cf` rule, kept
inside spm.model): the lowercased setting of the Multi30k literature, in which the model reads
and writes lowercase text, while the prepared references keep their case.

With `data.tokenizer.pretokenizer: moses` the subword model reads Moses-tokenized text instead,
as Wu et al. (2021) and the Multi30k literature train: each source sentence goes through
`pipeline.data.moses.moses_tokenize` in the source language, each target in the target
language (lowercased first under `case_fold`, as the dataset's task1-tokenize.sh does, and
sentencepiece then normalises nothing), and decoded output through `moses_detokenize` in the
target language, so that translations are plain text scored against the raw references. The
setting is recorded beside the model (`spm.pretokenizer.json`, `Pretokenizer`), so that every
loader of spm.model (evaluate, translate, decoding search, export) pre-processes the same way;
a model without that file (every one made before the key existed) reads text as it is.

With `data.tokenizer.model_type: subword_nmt` the subwords are subword-nmt's joint BPE
(`pipeline.data.subword_nmt`, the Multi30k dataset's task1-bpe.sh, as Wu et al. (2021) segment):
`data.tokenizer.vocab_size` merges learned on the pre-tokenized training text of both sides, then
a sentencepiece `word` model gives each piece of the segmented training text one id (fairseq's
joined dictionary: every piece, plus the four specials). The merges are kept beside spm.model;
text is segmented after pre-tokenization, and decoded text loses the `@@` joiners before
detokenization.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import sentencepiece as spm

from pipeline.atomic import write_json_atomic
from pipeline.config_schema import PRETOKENIZERS, DataConfig, TokenizerConfig
from pipeline.data.moses import moses_detokenize, moses_tokenize
from pipeline.data.subword_nmt import SubwordNmt, codes_path, join
from pipeline.errors import DataError

MODEL_FILE = "spm.model"
PRETOKENIZER_SUFFIX = ".pretokenizer.json"  # spm.pretokenizer.json beside spm.model
NO_PRETOKENIZER = "none"
SUBWORD_NMT = "subword_nmt"  # data.tokenizer.model_type: subword-nmt's BPE, then a word model
WORD_PREFIX = "\u2581"  # sentencepiece's whitespace mark, which begins every piece of a word model
REPRO_HINT = "re-run `dvc repro tokenize` (or `python -m pipeline.stages.tokenize`)"


def pretokenizer_path(model_path: str | os.PathLike) -> Path:
    """Where the pre-tokenization of the subword model at `model_path` is recorded."""
    return Path(model_path).with_suffix(PRETOKENIZER_SUFFIX)


@dataclass(frozen=True)
class Pretokenizer:
    """What text goes through before the subword model reads it, and decoded text after it
    (`data.tokenizer.pretokenizer`); the defaults: nothing, the text as it is."""

    method: str = NO_PRETOKENIZER  # none | moses
    lowercase: bool = False  # moses: lowercase before Moses (data.tokenizer.case_fold)
    src_lang: str = ""  # moses: the language rules for sources / targets
    tgt_lang: str = ""

    @classmethod
    def from_config(cls, data: DataConfig) -> Pretokenizer:
        tok = data.tokenizer
        if tok.pretokenizer == NO_PRETOKENIZER:
            return cls()  # case folding, if any, is sentencepiece's own (inside spm.model)
        return cls(tok.pretokenizer, tok.case_fold, data.src_lang, data.tgt_lang)

    @classmethod
    def read(cls, model_path: str | os.PathLike) -> Pretokenizer:
        """The one recorded beside `model_path`; none where nothing is recorded."""
        path = pretokenizer_path(model_path)
        if not path.is_file():
            return cls()
        try:
            found = cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as err:
            raise DataError(f"{path}: unreadable ({err}); {REPRO_HINT}") from None
        if found.method not in PRETOKENIZERS:
            raise DataError(f"{path}: unknown method {found.method!r}; {REPRO_HINT}")
        return found

    def write(self, model_path: str | os.PathLike) -> None:
        """Record it beside `model_path`. Nothing for none: a model made without this key
        reads text as it is, and one made with it set to none stays the same bytes."""
        if self.method != NO_PRETOKENIZER:
            write_json_atomic(pretokenizer_path(model_path), asdict(self))

    def sources(self, texts: Sequence[str]) -> list[str]:
        """Source sentences as the subword model reads them."""
        return self._tokenize(texts, self.src_lang)

    def targets(self, texts: Sequence[str]) -> list[str]:
        """Target sentences as the subword model reads them."""
        return self._tokenize(texts, self.tgt_lang)

    def _tokenize(self, texts: Sequence[str], lang: str) -> list[str]:
        if self.method == NO_PRETOKENIZER:
            return list(texts)
        return moses_tokenize(texts, lang, lowercase=self.lowercase)

    def detokenize(self, text: str) -> str:
        """Decoded target text as plain text."""
        if self.method == NO_PRETOKENIZER:
            return text
        return moses_detokenize([text], self.tgt_lang)[0]

    def describe(self) -> str:
        if self.method == NO_PRETOKENIZER:
            return "text as it is (data.tokenizer.pretokenizer=none)"
        case = "lowercased, " if self.lowercase else ""
        return (
            f"{case}{self.method}-tokenized {self.src_lang}->{self.tgt_lang} text "
            f"(data.tokenizer.pretokenizer={self.method}, "
            f"data.tokenizer.case_fold={str(self.lowercase).lower()})"
        )


class Tokenizer:
    """A trained sentencepiece model with the pre-tokenization of the text it reads
    (`Pretokenizer`) and, for subword-nmt's BPE, its merges (`subwords`); ids exclude bos/eos
    (the batches add them), except the eos that ends every source sentence under `source_eos`
    (`encode_sources`)."""

    def __init__(
        self,
        processor: spm.SentencePieceProcessor,
        source_eos: bool = False,
        pretokenizer: Pretokenizer = Pretokenizer(),
        subwords: SubwordNmt | None = None,
    ) -> None:
        self.processor = processor
        self.source_eos = source_eos
        self.pretokenizer = pretokenizer
        self.subwords = subwords
        self.vocab_size: int = processor.get_piece_size()
        self.pad_id: int = processor.pad_id()
        self.unk_id: int = processor.unk_id()
        self.bos_id: int = processor.bos_id()
        self.eos_id: int = processor.eos_id()
        self._special = {self.pad_id, self.bos_id, self.eos_id}

    def save(self, model_path: str | os.PathLike) -> None:
        """Write the subword model to `model_path` with what `load` reads beside it (the
        pre-tokenization, subword-nmt's merges): a copy that travels with a model."""
        Path(model_path).write_bytes(self.processor.serialized_model_proto())
        self.pretokenizer.write(model_path)
        if self.subwords is not None:
            self.subwords.write(model_path)

    @classmethod
    def load(cls, path: str | os.PathLike, source_eos: bool = False) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: tokenizer model not found; {REPRO_HINT}")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as err:
            raise DataError(f"{path}: not a sentencepiece model ({err}); {REPRO_HINT}") from None
        return cls(processor, source_eos, Pretokenizer.read(path), SubwordNmt.read(path))

    @classmethod
    def for_data(cls, path: str | os.PathLike, data: DataConfig) -> Tokenizer:
        """The subword model at `path` as a run of `data` reads and writes text: sources with
        eos as `data.tokenizer.source_eos` says, and the pre-tokenization recorded beside the
        model, which must be the one `data` asks for (a DataError naming the key if not), and
        subword-nmt's merges beside it exactly when `data.tokenizer.model_type` says so."""
        tokenizer = cls.load(path, data.tokenizer.source_eos)
        wanted = Pretokenizer.from_config(data)
        if tokenizer.pretokenizer != wanted:
            raise DataError(
                f"{path}: the subword model reads {tokenizer.pretokenizer.describe()}, but the "
                f"config asks for {wanted.describe()}; {REPRO_HINT}"
            )
        wants_merges = data.tokenizer.model_type == SUBWORD_NMT
        if (tokenizer.subwords is not None) != wants_merges:
            found = "has" if tokenizer.subwords is not None else "has no"
            raise DataError(
                f"{path}: the subword model {found} subword-nmt merges beside it "
                f"({codes_path(path).name}), but the config asks for "
                f"data.tokenizer.model_type={data.tokenizer.model_type}; {REPRO_HINT}"
            )
        return tokenizer

    def encode(self, text: str) -> list[int]:
        """Ids of `text` as given: already pre-tokenized and segmented
        (`encode_sources`/`encode_targets` do both to corpus text)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of every text."""
        if self.subwords is not None:
            return self._ids_of_pieces(texts)
        # One thread: the other stages (and other users of the machine) keep their cores.
        return self.processor.encode(list(texts), out_type=int, num_threads=1)

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """What the encoder reads for each source sentence: its pieces after pre-tokenization
        (and subword-nmt's segmentation), then eos under `source_eos`. Training data and every
        translation encode sources through here."""
        text = self.pretokenizer.sources(texts)
        if self.subwords is not None:
            return self._ids_of_pieces(self.subwords.sources(text), add_eos=self.source_eos)
        return self.processor.encode(text, out_type=int, num_threads=1, add_eos=self.source_eos)

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """The pieces of each target sentence after pre-tokenization (and subword-nmt's
        segmentation); the batches add bos/eos."""
        text = self.pretokenizer.targets(texts)
        if self.subwords is not None:
            text = self.subwords.targets(text)
        return self.encode_batch(text)

    def _ids_of_pieces(self, lines: Sequence[str], add_eos: bool = False) -> list[list[int]]:
        """One id per whitespace-separated piece of segmented `lines`, an unknown piece <unk>,
        as fairseq's dictionary maps them (sentencepiece's encoder would merge a run of
        unknowns into one <unk>)."""
        eos = [self.eos_id] if add_eos else []
        piece_to_id = self.processor.piece_to_id
        return [
            [piece_to_id(WORD_PREFIX + piece) for piece in line.split()] + eos for line in lines
        ]

    def decode(self, ids: Iterable[int]) -> str:
        """Target text of `ids`, skipping pad/bos/eos, subword-nmt's joiners removed, detokenized
        when the model reads pre-tokenized text; an unknown piece reads '⁇'.

        Whitespace is re-normalised (sentencepiece pads '⁇' with spaces); for text without
        unknowns this changes nothing, since `prepare` wrote it normalised.
        """
        pieces = [int(i) for i in ids if int(i) not in self._special]
        text = " ".join(self.processor.decode(pieces).split())
        if self.subwords is not None:
            text = join(text)
        return self.pretokenizer.detokenize(text)

    def piece(self, token_id: int) -> str:
        return self.processor.id_to_piece(int(token_id))


def word_vocab_size(sentences: Iterable[str], tok: TokenizerConfig) -> int:
    """The size of a `word` model that gives every whitespace-separated piece of `sentences`
    an id of its own, with the specials: fairseq's joined dictionary of segmented text."""
    specials = {tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id}
    return len({piece for line in sentences for piece in line.split()}) + len(specials)


def train_tokenizer(
    sentences: Iterable[str], tok: TokenizerConfig, model_path: Path, seed: int
) -> Path:
    """Train the joint model on `sentences`; writes `model_path` and the `.vocab` beside it.

    The model is serialised in memory (`model_writer`), not via `model_prefix`, because
    sentencepiece records `model_prefix` (a temp path here) inside the model file, which would
    make identical trainings differ in their bytes.
    Under subword_nmt `sentences` are segmented already, and every piece gets an id.
    """
    model_type, vocab_size = tok.model_type, tok.vocab_size
    if model_type == SUBWORD_NMT:
        sentences = list(sentences)
        model_type, vocab_size = "word", word_vocab_size(sentences, tok)
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=tok.character_coverage,
            pad_id=tok.pad_id,
            unk_id=tok.unk_id,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            # prepare already normalised (NFC, spaces); case folding when asked for, unless
            # the text was lowercased before Moses tokenized it (Pretokenizer)
            normalization_rule_name="nfkc_cf" if folds_case(tok) else "identity",
            input_sentence_size=0,  # all sentences, no sampling
            shuffle_input_sentence=False,
            num_threads=1,  # deterministic merge order, modest CPU
            minloglevel=2,
        )
    except RuntimeError as err:
        raise DataError(
            f"sentencepiece training failed: {str(err).strip()}; check data.tokenizer "
            "(e.g. data.tokenizer.vocab_size larger than the training text allows)"
        ) from None
    model_path.write_bytes(model.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = (
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n" for i in range(len(processor))
    )
    model_path.with_suffix(".vocab").write_text("".join(vocab), encoding="utf-8")
    return model_path


def folds_case(tok: TokenizerConfig) -> bool:
    """Whether sentencepiece itself folds case (`nfkc_cf`): under `case_fold`, unless a
    pretokenizer lowercased the text already."""
    return tok.case_fold and tok.pretokenizer == NO_PRETOKENIZER
