"""Our pipeline reads Wu et al.'s subword segmentation as it is: one id per subword."""

from __future__ import annotations

import argparse

from benchmarks.fairseq import train_peer, wu2021_segmentation
from pipeline.data.prepared import prepare
from pipeline.data.tokenized import load_tokenized, tokenize
from pipeline.data.tokenizer import Tokenizer


def _segment(line: str) -> str:
    """A stand-in for subword-nmt's output: words over four letters split with its joiner."""
    return " ".join(w if len(w) <= 4 else f"{w[:3]}@@ {w[3:]}" for w in line.split())


def _segmented_layout(tmp_path, multi30k_dir) -> tuple[argparse.Namespace, train_peer.Layout]:
    args = train_peer.build_parser().parse_args(
        [
            "--corpus",
            str(multi30k_dir),
            "--work-dir",
            str(tmp_path / "work"),
            "--max-train-pairs",
            "3000",
            "--max-eval-pairs",
            "40",
        ]  # fmt: skip
    )
    layout = train_peer.Layout(args.work_dir)
    train_peer.prepare(args, layout, train_peer.data_settings(args))
    layout.bpe.mkdir()
    for subset in train_peer.SUBSETS:
        for lang in (args.src, args.tgt):
            text = layout.tok_file(subset, lang).read_text(encoding="utf-8").splitlines()
            segmented = "\n".join(_segment(line) for line in text) + "\n"
            layout.bpe_file(subset, lang).write_text(segmented, encoding="utf-8")
    return args, layout


def test_the_overrides_give_one_id_per_subword_of_the_segmented_files(
    tmp_path, multi30k_dir, make_config
):
    args, layout = _segmented_layout(tmp_path, multi30k_dir)
    overrides = wu2021_segmentation.overrides(args, layout)
    cfg = make_config("experiment=multi30k_wu2021", *overrides)
    prepare(cfg)
    tokenize(cfg)
    tokenizer = Tokenizer.for_data(f"{cfg.paths.tokenized}/spm.model", cfg.data)
    train_units = {u for lang in ("en", "de")
                   for u in layout.bpe_file("train", lang).read_text().split()}  # fmt: skip
    assert tokenizer.vocab_size == len(train_units) + 4  # <pad> <unk> <s> </s>
    splits = load_tokenized(cfg.paths.tokenized)
    for subset, split in wu2021_segmentation.SPLITS.items():
        targets = layout.bpe_file(subset, "de").read_text(encoding="utf-8").splitlines()
        sources = layout.bpe_file(subset, "en").read_text(encoding="utf-8").splitlines()
        tgt_ids, src_ids = splits[split]["tgt_ids"][:], splits[split]["src_ids"][:]
        if split == "train":  # every training subword has an id of its own
            assert all(tokenizer.unk_id not in ids for ids in tgt_ids + src_ids)
        # (sentencepiece reads consecutive unseen subwords of val/test as one unk)
        known = [i for i, ids in enumerate(tgt_ids) if tokenizer.unk_id not in ids]
        assert len(known) >= len(tgt_ids) // 4
        assert [len(tgt_ids[i]) for i in known] == [len(targets[i].split()) for i in known]
        assert [tokenizer.decode(tgt_ids[i]) for i in known] == [targets[i] for i in known]
        # fairseq's encoding: every source ends with eos (the preset's source_eos)
        known = [i for i, ids in enumerate(src_ids) if tokenizer.unk_id not in ids]
        assert [len(src_ids[i]) for i in known] == [len(sources[i].split()) + 1 for i in known]
