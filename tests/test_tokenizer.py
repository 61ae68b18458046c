"""The joint sentencepiece model and the tokenize stage, on the real Multi30k splits."""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer
from sentencepiece import sentencepiece_model_pb2

from pipeline.config import RAW_DIR_ENV
from pipeline.data.prepared import prepared_path
from pipeline.data.tokenized import (
    COLUMNS,
    OVER_SPM_LIMIT,
    SPLITS_DIR,
    SPM_MAX_SENTENCE_BYTES,
    load_tokenized,
    tokenize,
)
from pipeline.data.tokenizer import MODEL_FILE, Pretokenizer, Tokenizer
from pipeline.errors import DataError, DiskFullError
from tests.conftest import run_stage, write_params
from tests.test_subword_nmt import MERGES, task1_bpe


def lines(path: Path) -> list[str]:
    return path.read_text("utf-8").split("\n")[:-1]


def copy_of(cfg, tmp_path: Path):
    """A private copy of a session config's outputs that a test may change or break."""
    cfg = copy.deepcopy(cfg)
    for name in ("prepared", "tokenized"):
        target = tmp_path / name
        shutil.copytree(getattr(cfg.paths, name), target)
        setattr(cfg.paths, name, str(target))
    cfg.paths.metrics_dir = str(tmp_path / "metrics")
    return cfg


@pytest.fixture(scope="module")
def full(tokenized_multi30k):
    cfg = tokenized_multi30k
    return cfg, Tokenizer.load(Path(cfg.paths.tokenized) / MODEL_FILE)


def test_round_trip_on_the_real_val_split(full):
    cfg, tok = full
    for split in (cfg.data.val_split, *cfg.data.test_splits):
        for lang in (cfg.data.src_lang, cfg.data.tgt_lang):
            text = lines(prepared_path(cfg, split, lang))
            encoded = tok.encode_batch(text)
            assert [tok.decode(ids) for ids in encoded] == text  # character_coverage = 1.0
            assert not any(tok.unk_id in ids for ids in encoded)
            assert encoded[:50] == [tok.encode(t) for t in text[:50]]


def test_special_ids_come_from_config_and_decode_skips_them(full):
    cfg, tok = full
    want = cfg.data.tokenizer
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (
        want.pad_id,
        want.unk_id,
        want.bos_id,
        want.eos_id,
    )
    assert tok.vocab_size == want.vocab_size
    assert [tok.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    text = "Zwei Hunde spielen im Schnee."
    ids = tok.encode(text)
    assert tok.bos_id not in ids and tok.eos_id not in ids
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]) == text
    assert tok.decode(tok.encode("Ein Mann 日本")) == "Ein Mann ⁇"  # unseen characters -> unk


def test_model_is_trained_on_the_training_split_only(full, tmp_path):
    """An independent training run on train.{src} then train.{tgt} gives the same pieces."""
    cfg, _ = full
    tok_cfg = cfg.data.tokenizer
    train_text = [
        line
        for lang in (cfg.data.src_lang, cfg.data.tgt_lang)
        for line in lines(prepared_path(cfg, cfg.data.train_split, lang))
    ]
    spm.set_random_generator_seed(cfg.seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train_text),
        model_writer=model,
        model_type=tok_cfg.model_type,
        vocab_size=tok_cfg.vocab_size,
        character_coverage=tok_cfg.character_coverage,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="<pad>",
        normalization_rule_name="identity",
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    independent = spm.SentencePieceProcessor(model_proto=model.getvalue())
    stage = Tokenizer.load(Path(cfg.paths.tokenized) / MODEL_FILE).processor
    assert len(independent) == len(stage)
    assert all(
        independent.id_to_piece(i) == stage.id_to_piece(i)
        and independent.get_score(i) == stage.get_score(i)
        for i in range(len(stage))
    )


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_training_is_deterministic(tokenized_smoke, tmp_path, model_type):
    models = []
    for run in ("a", "b"):
        cfg = copy.deepcopy(tokenized_smoke)
        cfg.data.tokenizer.model_type = model_type
        cfg.paths.tokenized = str(tmp_path / run / "tokenized")
        cfg.paths.metrics_dir = str(tmp_path / run / "metrics")
        tokenize(cfg)
        models.append(Path(cfg.paths.tokenized, MODEL_FILE).read_bytes())
        ids = load_tokenized(cfg.paths.tokenized)["val"]["src_ids"][:]
        models.append(ids)
    assert models[0] == models[2] and models[1] == models[3]


def test_saved_splits_follow_the_contract(tokenized_smoke):
    cfg = tokenized_smoke
    tok = Tokenizer.load(Path(cfg.paths.tokenized) / MODEL_FILE)
    splits = load_tokenized(cfg.paths.tokenized)
    assert list(splits) == [cfg.data.train_split, cfg.data.val_split, *cfg.data.test_splits]
    metrics = json.loads(Path(cfg.paths.metrics_dir, "tokenize.json").read_text())
    assert metrics["vocab_size"] == tok.vocab_size == cfg.data.tokenizer.vocab_size
    for name, table in splits.items():
        assert set(COLUMNS) == set(table.column_names)
        rows = table[:]
        assert rows["src_text"] == lines(prepared_path(cfg, name, cfg.data.src_lang))
        assert rows["tgt_text"] == lines(prepared_path(cfg, name, cfg.data.tgt_lang))
        assert rows["src_ids"] == [tok.encode(t) for t in rows["src_text"]]
        assert rows["tgt_ids"] == [tok.encode(t) for t in rows["tgt_text"]]
        assert rows["src_len"] == [len(ids) for ids in rows["src_ids"]]
        assert rows["tgt_len"] == [len(ids) for ids in rows["tgt_ids"]]
        stats = metrics["splits"][name]
        assert stats["sentences"] == len(table)
        assert stats["src_tokens"] == sum(rows["src_len"])
        unknown = sum(ids.count(tok.unk_id) for ids in rows["tgt_ids"])
        assert stats["tgt_unk_rate"] == pytest.approx(unknown / sum(rows["tgt_len"]))
    assert metrics["splits"]["train"]["src_unk_rate"] == 0.0  # every training char is covered


def retrained(tokenized_smoke, tmp_path: Path, **tokenizer_settings):
    """The smoke corpus's subword model retrained with `tokenizer_settings` (in tmp_path),
    and the prepared val targets."""
    cfg = copy.deepcopy(tokenized_smoke)
    for key, value in tokenizer_settings.items():
        setattr(cfg.data.tokenizer, key, value)
    cfg.paths.tokenized = str(tmp_path / "tokenized")
    cfg.paths.metrics_dir = str(tmp_path / "metrics")
    tokenize(cfg)
    tok = Tokenizer.load(Path(cfg.paths.tokenized) / MODEL_FILE, cfg.data.tokenizer.source_eos)
    return tok, lines(prepared_path(cfg, "val", cfg.data.tgt_lang))


def test_lower_character_coverage_only_adds_unknowns(tokenized_smoke, tmp_path):
    tok, text = retrained(tokenized_smoke, tmp_path, character_coverage=0.995)
    encoded = tok.encode_batch(text)
    with_unk = [i for i, ids in enumerate(encoded) if tok.unk_id in ids]
    assert with_unk, "coverage < 1 should leave rare characters out of the vocabulary"
    assert all(tok.decode(ids) == t for ids, t in zip(encoded, text) if tok.unk_id not in ids)


def test_case_fold_reads_and_writes_lowercase(tokenized_smoke, tmp_path):
    tok, text = retrained(tokenized_smoke, tmp_path, case_fold=True)
    encoded = tok.encode_batch(text)
    assert any(t != t.lower() for t in text)  # the references are cased
    lowered = tok.encode_batch([t.lower() for t in text])
    assert sum(a == b for a, b in zip(encoded, lowered)) >= 0.99 * len(text)
    decoded = [(tok.decode(ids), t) for ids, t in zip(encoded, text) if tok.unk_id not in ids]
    assert decoded and all(d == d.lower() for d, _ in decoded)
    # The round trip gives the lowercased text (NFKC may change a rare character).
    assert sum(d == t.lower() for d, t in decoded) >= 0.99 * len(decoded)


def test_source_eos_ends_every_encoded_source_and_only_sources(tokenized_smoke, tmp_path):
    tok, _ = retrained(tokenized_smoke, tmp_path, source_eos=True)
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.paths.tokenized = str(tmp_path / "tokenized")
    plain = load_tokenized(tokenized_smoke.paths.tokenized)["val"]
    with_eos = load_tokenized(cfg.paths.tokenized, source_eos=True)["val"]
    # Same subword model (source_eos does not change training): the sources gain one eos.
    assert with_eos["src_ids"] == [ids + [tok.eos_id] for ids in plain["src_ids"]]
    assert with_eos["src_len"] == [n + 1 for n in plain["src_len"]]
    assert with_eos["tgt_ids"] == plain["tgt_ids"]  # targets: the batches add bos/eos
    sources = lines(prepared_path(cfg, "val", cfg.data.src_lang))[:20]
    assert tok.encode_sources(sources) == with_eos["src_ids"][:20]  # translation == training
    assert Tokenizer(tok.processor).encode_sources(sources) == plain["src_ids"][:20]
    # Data encoded one way and a config saying the other: refused before any training.
    for root, wanted in ((cfg.paths.tokenized, False), (tokenized_smoke.paths.tokenized, True)):
        with pytest.raises(DataError, match=r"data\.tokenizer\.source_eos.*dvc repro tokenize"):
            load_tokenized(root, source_eos=wanted)


# ---- a damaged cache is detected -----------------------------------------------------------


def arrow_file(tokenized: Path, split: str) -> Path:
    return sorted((tokenized / SPLITS_DIR / split).glob("*.arrow"))[0]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda root: truncate(arrow_file(root, "train")), "train"),
        (lambda root: flip_byte(arrow_file(root, "val")), "val"),
        (lambda root: (root / SPLITS_DIR / "val" / "state.json").unlink(), "state.json"),
        (lambda root: (root / "manifest.json").unlink(), "manifest.json"),
        (lambda root: (root / "manifest.json").write_text("{"), "manifest.json"),
    ],
    ids=["truncated-arrow", "flipped-byte", "missing-state", "missing-manifest", "bad-manifest"],
)
def test_damaged_tokenized_cache_is_detected(tokenized_smoke, tmp_path, damage, named):
    root = tmp_path / "tokenized"
    shutil.copytree(tokenized_smoke.paths.tokenized, root)
    load_tokenized(root)  # intact copy loads
    damage(root)
    with pytest.raises(DataError) as err:
        load_tokenized(root)
    assert str(root) in str(err.value) and named in str(err.value)
    assert "dvc repro tokenize" in str(err.value)


def test_failed_tokenize_keeps_previous_output(tokenized_smoke, tmp_path):
    cfg = copy_of(tokenized_smoke, tmp_path)
    tokenize(cfg)
    before = {p: p.read_bytes() for p in Path(cfg.paths.tokenized).rglob("*") if p.is_file()}
    cfg.data.tokenizer.vocab_size = 500_000  # more pieces than the text allows
    with pytest.raises(DataError, match="data.tokenizer"):
        tokenize(cfg)
    after = {p: p.read_bytes() for p in Path(cfg.paths.tokenized).rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    Path(cfg.paths.prepared, "val.de").unlink()
    with pytest.raises(DataError, match=r"val\.de.*dvc repro prepare"):
        tokenize(cfg)


def test_tokenize_stage_cli(tokenized_smoke, tmp_path, multi30k_dir):
    write_params(tmp_path, "experiment=smoke")
    shutil.copytree(tokenized_smoke.paths.prepared, tmp_path / "data" / "prepared")
    done = run_stage("tokenize", tmp_path, {**os.environ, RAW_DIR_ENV: str(multi30k_dir)})
    assert done.returncode == 0, done.stderr
    tokenized = tmp_path / "data" / "tokenized"
    assert len(load_tokenized(tokenized)["train"]) == 2000
    model = Path(tokenized_smoke.paths.tokenized, MODEL_FILE).read_bytes()
    assert (tokenized / MODEL_FILE).read_bytes() == model  # same input, same bytes
    assert json.loads((tmp_path / "metrics" / "tokenize.json").read_text())["vocab_size"] == 1000


# ---- sentences over sentencepiece's limit on a training sentence ------------------------------

LIMIT = SPM_MAX_SENTENCE_BYTES


def sentence_of(size: int, text: str) -> str:
    """The words of `text`, repeated, as a sentence of exactly `size` UTF-8 bytes."""
    words = " ".join([text] * (size // len(text) + 1)).encode("utf-8")
    sentence = words[:size].decode("utf-8", "ignore").rstrip()
    return sentence + "." * (size - len(sentence.encode("utf-8")))


def replace_lines(path: Path, changes: dict[int, str]) -> None:
    """Put `changes` ({line number from 1: sentence}) into a prepared text file."""
    text = lines(path)
    for line, sentence in changes.items():
        text[line - 1] = sentence
    path.write_text("".join(f"{line}\n" for line in text), encoding="utf-8")


def sentencepiece_trains_on(size: int) -> None:
    """sentencepiece's trainer on 30 sentences of exactly `size` UTF-8 bytes each."""
    sentences = [sentence_of(size, f"Ein Hund {i} läuft im Schnee.") for i in range(30)]
    assert {len(s.encode("utf-8")) for s in sentences} == {size}
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=io.BytesIO(), vocab_size=30,
        input_sentence_size=0, num_threads=1, minloglevel=2,
    )  # fmt: skip


def test_a_training_pair_over_the_limit_is_dropped_named_and_counted(tokenized_smoke, tmp_path):
    """sentencepiece would skip the sentence without a word; tokenize drops its pair (both
    sides stay aligned), warns with file, line, bytes and limit, and counts it in
    tokenize.json. A val sentence of any length is kept whole: only training is limited."""
    cfg = copy_of(tokenized_smoke, tmp_path)
    train = {lang: prepared_path(cfg, "train", lang) for lang in ("en", "de")}
    before = {lang: lines(path) for lang, path in train.items()}
    replace_lines(train["en"], {5: sentence_of(LIMIT + 1, before["en"][4]),
                                20: sentence_of(LIMIT, before["en"][19])})  # fmt: skip
    replace_lines(train["de"], {10: sentence_of(LIMIT + 1, before["de"][9])})
    val = prepared_path(cfg, "val", "de")
    long_val = sentence_of(3 * LIMIT, lines(val)[2])
    replace_lines(val, {3: long_val})
    with pytest.warns(UserWarning, match="training pairs dropped") as caught:
        tokenize(cfg)
    [warning] = [str(w.message) for w in caught if "training pairs dropped" in str(w.message)]
    assert warning.startswith(
        f"2 of 2000 training pairs dropped: a sentence over sentencepiece's limit of {LIMIT} "
        f"UTF-8 bytes cannot train the subword model ({train['en']}:5: {LIMIT + 1} bytes; "
        f"{train['de']}:10: {LIMIT + 1} bytes)"
    )
    splits = load_tokenized(cfg.paths.tokenized)
    kept = [i for i in range(2000) if i not in (4, 9)]  # the one at exactly LIMIT stays
    assert splits["train"]["src_text"] == [lines(train["en"])[i] for i in kept]
    assert splits["train"]["tgt_text"] == [lines(train["de"])[i] for i in kept]
    metrics = json.loads(Path(cfg.paths.metrics_dir, "tokenize.json").read_text())
    assert metrics["splits"]["train"]["dropped"] == {OVER_SPM_LIMIT: 2}
    assert metrics["splits"]["train"]["sentences"] == 1998
    assert splits["val"]["tgt_text"] == lines(val)  # nothing dropped from val
    tok = Tokenizer.load(Path(cfg.paths.tokenized) / MODEL_FILE)
    assert tok.decode(splits["val"]["tgt_ids"][2]) == long_val  # encoded whole


def test_tokenize_stage_refuses_training_text_with_every_sentence_over_the_limit(
    tokenized_smoke, tmp_path
):
    """Before: sentencepiece's `[!sentences_.empty()]` and advice about vocab_size."""
    # SPM_MAX_SENTENCE_BYTES is sentencepiece's own limit: sentences of that many bytes train,
    # one byte longer are all skipped, which is the error the stage used to pass on.
    sentencepiece_trains_on(LIMIT)
    with pytest.raises(RuntimeError, match=r"sentences_\.empty\(\)"):
        sentencepiece_trains_on(LIMIT + 1)
    write_params(tmp_path, "experiment=smoke")
    prepared = tmp_path / "data" / "prepared"
    shutil.copytree(tokenized_smoke.paths.prepared, prepared)
    for lang, size in (("en", LIMIT + 100), ("de", LIMIT + 50)):
        path = prepared / f"train.{lang}"
        path.write_text("".join(f"{sentence_of(size, t)}\n" for t in lines(path)[:50]), "utf-8")
    done = run_stage("tokenize", tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(
        f"error: data/prepared/train.en:1: {LIMIT + 100} bytes, over sentencepiece's limit of "
        f"{LIMIT} UTF-8 bytes for a training sentence, and every one of the 50 training pairs "
        "has a sentence that long"
    )
    assert "vocab_size" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "tokenized").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("split", "lang", "side"),
    [("val", "de", "target"), ("test_2016_flickr", "en", "source")],
)
def test_a_long_eval_sentence_is_kept_and_training_refuses_it_naming_its_line(
    tokenized_smoke, tmp_path, split, lang, side
):
    """A val or test sentence over the limit is tokenized whole; longer than
    model.max_positions where the model reads it (a val target in the decoder, a test source
    evaluation will decode), the train stage refuses it before training, with advice for that
    split (not the training filter, which it is not under), naming its line."""
    write_params(tmp_path, "experiment=smoke")
    prepared = tmp_path / "data" / "prepared"
    shutil.copytree(tokenized_smoke.paths.prepared, prepared)
    long_line = sentence_of(LIMIT + 1, lines(prepared / f"{split}.{lang}")[7])
    replace_lines(prepared / f"{split}.{lang}", {8: long_line})
    tokenized = run_stage("tokenize", tmp_path)
    assert tokenized.returncode == 0, tokenized.stderr[-3000:]
    column = "tgt_text" if side == "target" else "src_text"
    assert load_tokenized(tmp_path / "data" / "tokenized")[split][column][7] == long_line
    refused = run_stage("train", tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"split '{split}' example 7 has a {side} of" in refused.stderr
    advice = (  # never the filter for a test split: filtered, it is no longer the benchmark
        f"shorten or remove that pair (line 8 of data/prepared/{split}.{lang}) in the '{split}' "
        "corpus files" + (" (a test split is scored whole: it is never filtered)" if side == "source"
                          else ", or add 'val' to data.filter.apply_to (now ['train'])")
    )  # fmt: skip
    assert advice in refused.stderr
    assert "training pairs" not in refused.stderr and "Traceback" not in refused.stderr
    assert not list(tmp_path.glob("models/**/*.ckpt"))  # refused before training


def test_disk_full_while_tokenizing_keeps_the_previous_output(tokenized_smoke, small_disk):
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.paths.tokenized = str(small_disk.path / "tokenized")
    cfg.paths.metrics_dir = str(small_disk.path.parent / "metrics")
    tokenize(cfg)  # the previous output, on the small disk

    def contents() -> dict[str, bytes]:
        root = Path(cfg.paths.tokenized)
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    before = contents()
    small_disk.fill(free=256 * 1024)  # the new output (~2 MB) is staged beside the old one
    with pytest.raises(DiskFullError) as full:  # a real ENOSPC from a real (tmpfs) filesystem
        tokenize(cfg)
    assert str(full.value).startswith(
        f"{cfg.paths.tokenized}: disk full (no space left on device) while writing it; the "
        "previous tokenized is intact."
    )
    assert contents() == before  # byte for byte
    assert sorted(p.name for p in small_disk.path.iterdir()) == [".filler", "tokenized"]
    reference = load_tokenized(tokenized_smoke.paths.tokenized)
    loaded = load_tokenized(cfg.paths.tokenized)  # passes its integrity checks
    assert {name: len(split) for name, split in loaded.items()} == {
        name: len(split) for name, split in reference.items()
    }


# ---- Moses pre-tokenization (data.tokenizer.pretokenizer: moses) ----------------------------


def moses_tokenized_copy(tokenized_smoke, root: Path, **tokenizer_settings):
    """The smoke corpus tokenized as Wu et al.'s recipe reads it: lowercased and
    Moses-tokenized before the subword model (outputs under `root`), with
    `tokenizer_settings` besides; its config."""
    cfg = moses_config(tokenized_smoke, root, **tokenizer_settings)
    tokenize(cfg)
    return cfg


def moses_config(tokenized_smoke, root: Path, **tokenizer_settings):
    """`moses_tokenized_copy`'s config, before its tokenize."""
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.data.tokenizer.pretokenizer = "moses"
    cfg.data.tokenizer.case_fold = True
    cfg.data.tokenizer.source_eos = True
    for key, value in tokenizer_settings.items():
        setattr(cfg.data.tokenizer, key, value)
    cfg.paths.tokenized = str(root / "tokenized")
    cfg.paths.metrics_dir = str(root / "metrics")
    return cfg


@pytest.fixture(scope="module")
def moses_smoke(tokenized_smoke, tmp_path_factory):
    cfg = moses_tokenized_copy(tokenized_smoke, tmp_path_factory.mktemp("moses_smoke"))
    return cfg, Tokenizer.for_data(Path(cfg.paths.tokenized) / MODEL_FILE, cfg.data)


def sacremoses_text(lines: list[str], lang: str) -> list[str]:
    """task1-tokenize.sh through sacremoses called directly (the independent reference)."""
    normalizer = MosesPunctNormalizer(lang=lang, perl_parity=True)
    tokenizer = MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
        for line in lines
    ]


def pieces_text(tok: Tokenizer, ids: list[int]) -> str:
    """The text a row of ids spells, piece by piece (not through sentencepiece's decoder)."""
    pieces = [tok.piece(i) for i in ids if i != tok.eos_id]
    return "".join(pieces).replace("▁", " ").strip()


def test_moses_pretokenizer_is_recorded_beside_the_model(moses_smoke, tokenized_smoke):
    cfg, tok = moses_smoke
    record = json.loads((Path(cfg.paths.tokenized) / "spm.pretokenizer.json").read_text())
    assert record == {"method": "moses", "lowercase": True, "src_lang": "en", "tgt_lang": "de"}
    assert tok.pretokenizer == Pretokenizer("moses", True, "en", "de")
    assert "spm.pretokenizer.json" in json.loads((Path(cfg.paths.tokenized) / "manifest.json")
                                                 .read_text())["files"]  # fmt: skip
    # A folder made without the key (or with none) has no record and reads text as it is.
    plain = Path(tokenized_smoke.paths.tokenized)
    assert not (plain / "spm.pretokenizer.json").exists()
    assert Tokenizer.load(plain / MODEL_FILE).pretokenizer == Pretokenizer()


def test_moses_splits_hold_the_subwords_of_task1_tokenize_text(moses_smoke):
    """Every saved source and target row spells exactly the text sacremoses gives for its
    sentence (sources in English, targets in German rules, lowercased), and the subword model
    was trained on that text: lowercase pieces, pieces of Moses' escapes among them."""
    cfg, tok = moses_smoke
    splits = load_tokenized(cfg.paths.tokenized, source_eos=True)
    for name in ("train", "val"):
        rows = splits[name][:]
        assert rows["src_text"] == lines(prepared_path(cfg, name, "en"))  # raw text kept
        moses_src = sacremoses_text(rows["src_text"], "en")
        moses_tgt = sacremoses_text(rows["tgt_text"], "de")
        assert [pieces_text(tok, ids) for ids in rows["src_ids"]] == moses_src
        assert [pieces_text(tok, ids) for ids in rows["tgt_ids"]] == moses_tgt
        assert rows["src_ids"] == [tok.encode(t) + [tok.eos_id] for t in moses_src]
        assert rows["tgt_ids"] == [tok.encode(t) for t in moses_tgt]
    vocabulary = [tok.piece(i) for i in range(4, tok.vocab_size)]
    assert all(piece == piece.lower() for piece in vocabulary)
    assert {"apos", "quot"} <= set(vocabulary)  # Moses' escapes &apos; and &quot;
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.processor.serialized_model_proto())
    assert proto.normalizer_spec.name == "identity"  # lowercased by Moses' step, not NFKC


def test_moses_decode_round_trips_real_lines_to_detokenized_lowercase(moses_smoke):
    """decode(encode(line)) of a target line is the line lowercased, Moses-normalised and
    -tokenized, then Moses-detokenized (sacremoses' detokenizer.perl, called here directly):
    plain text, as the references are."""
    cfg, tok = moses_smoke
    detokenizer = MosesDetokenizer(lang="de")
    for split in ("val", "test_2016_flickr"):
        text = lines(prepared_path(cfg, split, "de"))
        expected = [
            detokenizer.detokenize(line.split(), unescape=True)
            for line in sacremoses_text(text, "de")
        ]
        # Lines with a character the smoke corpus's 2000 training pairs lack decode an unknown.
        known = [i for i, ids in enumerate(tok.encode_targets(text)) if tok.unk_id not in ids]
        assert len(known) >= 0.95 * len(text)
        decoded = [tok.decode(ids) for ids in tok.encode_targets([text[i] for i in known])]
        assert decoded == [expected[i] for i in known]
        assert not any("&quot;" in d or "&apos;" in d for d in decoded)
        # Mostly the raw line lowercased: Moses' normalisation changes a few quotes and spaces.
        assert sum(d == text[i].lower() for d, i in zip(decoded, known)) >= 0.95 * len(known)


def test_moses_encode_sources_reads_raw_text_as_training_did(moses_smoke):
    cfg, tok = moses_smoke
    sources = lines(prepared_path(cfg, "val", "en"))
    saved = load_tokenized(cfg.paths.tokenized, source_eos=True)["val"]["src_ids"]
    assert tok.encode_sources(sources) == saved  # translation reads what training read


def test_a_config_asking_for_another_pretokenization_is_refused(moses_smoke, tokenized_smoke):
    """A model and a config that disagree (a stale tokenized folder, a wrong --tokenizer):
    refused with the key named, before anything is translated or trained."""
    cfg, _ = moses_smoke
    moses_model = Path(cfg.paths.tokenized) / MODEL_FILE
    assert Tokenizer.for_data(moses_model, cfg.data).pretokenizer.method == "moses"
    with pytest.raises(
        DataError,
        match=r"reads lowercased, moses-tokenized en->de text.*"
        r"asks for text as it is \(data\.tokenizer\.pretokenizer=none\)",
    ):
        Tokenizer.for_data(moses_model, tokenized_smoke.data)
    plain_model = Path(tokenized_smoke.paths.tokenized) / MODEL_FILE
    with pytest.raises(DataError, match=r"data\.tokenizer\.pretokenizer=moses.*dvc repro tok"):
        Tokenizer.for_data(plain_model, cfg.data)
    cased = copy.deepcopy(cfg)
    cased.data.tokenizer.case_fold = False
    with pytest.raises(DataError, match=r"data\.tokenizer\.case_fold=false"):
        Tokenizer.for_data(moses_model, cased.data)
    from pipeline.data.datamodule import TranslationDataModule

    stale = copy.deepcopy(tokenized_smoke)  # the config says moses, the folder was made without
    stale.data.tokenizer.pretokenizer = "moses"
    with pytest.raises(DataError, match=r"data\.tokenizer\.pretokenizer"):
        TranslationDataModule(stale).setup("fit")


def test_a_damaged_pretokenizer_record_is_named(moses_smoke, tmp_path):
    cfg, _ = moses_smoke
    shutil.copytree(cfg.paths.tokenized, tmp_path / "tokenized")
    record = tmp_path / "tokenized" / "spm.pretokenizer.json"
    record.write_text('{"method": "spacy"}')
    with pytest.raises(DataError, match=f"{record}: unknown method 'spacy'"):
        Tokenizer.load(tmp_path / "tokenized" / MODEL_FILE)
    record.write_text("{")
    with pytest.raises(DataError, match=f"{record}: unreadable"):
        Tokenizer.load(tmp_path / "tokenized" / MODEL_FILE)


# ---- subword-nmt's BPE (data.tokenizer.model_type: subword_nmt) ----------------------------


@pytest.fixture(scope="module")
def subword_nmt_smoke(tokenized_smoke, tmp_path_factory):
    """The smoke corpus as Wu et al. segment it: Moses, then 500 subword-nmt merges."""
    cfg = moses_tokenized_copy(tokenized_smoke, tmp_path_factory.mktemp("subword_nmt_smoke"),
                               model_type="subword_nmt", vocab_size=MERGES)  # fmt: skip
    return cfg, Tokenizer.for_data(Path(cfg.paths.tokenized) / MODEL_FILE, cfg.data)


def test_subword_nmt_splits_hold_task1_bpe_pieces_one_id_each(subword_nmt_smoke, tmp_path):
    """Every saved row is the pieces that task1-tokenize.sh then task1-bpe.sh (sacremoses and
    the `subword-nmt` command, called here directly) give its sentence, one id per piece; the
    vocabulary is every piece of the segmented training text and the four specials, as
    fairseq-preprocess's joined dictionary is."""
    cfg, tok = subword_nmt_smoke
    splits = load_tokenized(cfg.paths.tokenized, source_eos=True)
    text = {name: (sacremoses_text(splits[name]["src_text"], "en"),
                   sacremoses_text(splits[name]["tgt_text"], "de")) for name in ("train", "val")}  # fmt: skip
    _, _, applied = task1_bpe(
        text["train"],
        {"src": text["train"][0] + text["val"][0], "tgt": text["train"][1] + text["val"][1]},
        MERGES,
        tmp_path,
    )
    rows = {name: splits[name][:] for name in ("train", "val")}
    trained = len(rows["train"]["src_ids"])
    vocabulary = {
        p for side in ("src", "tgt") for line in applied[side][:trained] for p in line.split()
    }
    assert tok.vocab_size == len(vocabulary) + 4
    # a piece never seen in training is one <unk> each, as in fairseq's dictionary
    expected = {side: [" ".join(p if p in vocabulary else "<unk>" for p in line.split())
                       for line in applied[side]] for side in ("src", "tgt")}  # fmt: skip
    assert any("<unk> <unk>" in line for line in expected["src"])  # not merged into one
    spelled = lambda ids: " ".join(tok.piece(i).lstrip("▁") for i in ids if i != tok.eos_id)  # noqa: E731
    for side in ("src", "tgt"):
        saved = rows["train"][f"{side}_ids"] + rows["val"][f"{side}_ids"]
        assert [spelled(ids) for ids in saved] == expected[side]
    assert all(ids[-1] == tok.eos_id for ids in rows["val"]["src_ids"])
    # encode() reads segmented text the same way (its unknowns one each, too)
    assert [tok.encode(line) + [tok.eos_id] for line in applied["src"][trained:]] == rows["val"][
        "src_ids"
    ]
    for name in ("spm.bpe-codes", "spm.bpe-vocab.src", "spm.bpe-vocab.tgt"):
        assert (
            name in json.loads((Path(cfg.paths.tokenized) / "manifest.json").read_text())["files"]
        )
    metrics = json.loads((Path(cfg.paths.metrics_dir) / "tokenize.json").read_text())
    assert metrics["model_type"] == "subword_nmt" and metrics["vocab_size"] == tok.vocab_size
    assert metrics["splits"]["train"]["src_unk_rate"] == 0.0


def test_subword_nmt_decode_joins_pieces_and_detokenizes(subword_nmt_smoke):
    """decode(encode(line)) of a target is the line as the Moses test above expects it: the
    `@@` joiners gone, Moses-detokenized (fairseq's --remove-bpe, then detokenizer.perl)."""
    cfg, tok = subword_nmt_smoke
    detokenizer = MosesDetokenizer(lang="de")
    text = lines(prepared_path(cfg, "val", "de"))
    expected = [detokenizer.detokenize(line.split(), unescape=True)
                for line in sacremoses_text(text, "de")]  # fmt: skip
    encoded = tok.encode_targets(text)
    known = [i for i, ids in enumerate(encoded) if tok.unk_id not in ids]
    assert len(known) >= 0.95 * len(text)
    assert [tok.decode(encoded[i]) for i in known] == [expected[i] for i in known]
    assert any("@@" in tok.piece(i) for ids in encoded for i in ids)


def test_a_config_and_a_model_disagreeing_on_subword_nmt_are_refused(subword_nmt_smoke,
                                                                      moses_smoke):  # fmt: skip
    cfg, _ = subword_nmt_smoke
    merged = Path(cfg.paths.tokenized) / MODEL_FILE
    sentencepiece_cfg, _ = moses_smoke
    with pytest.raises(DataError, match=r"has subword-nmt merges .*spm\.bpe-codes.*"
                                        r"model_type=bpe; re-run `dvc repro tokenize`"):  # fmt: skip
        Tokenizer.for_data(merged, sentencepiece_cfg.data)
    with pytest.raises(DataError, match=r"has no subword-nmt merges .*model_type=subword_nmt"):
        Tokenizer.for_data(Path(sentencepiece_cfg.paths.tokenized) / MODEL_FILE, cfg.data)
