"""The corpus sources (pipeline.data.sources): a missing Multi30k file named, and the text and
Hugging Face sources giving the same prepared corpus as Multi30k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.data.prepared import prepare
from pipeline.errors import DataError
from tests.conftest import SPLITS, snapshot


def test_missing_configured_test_split_names_its_files(sliced_config):
    with pytest.raises(DataError, match=r"test_2017_mscoco\.en, test_2017_mscoco\.de"):
        prepare(sliced_config("data.test_splits=[test_2016_flickr,test_2017_mscoco]"))


def test_text_source_matches_multi30k_source(sliced_config, sliced_corpus, tmp_path):
    reference = sliced_config()
    prepare(reference)
    files = [  # a user adds the split -> {src, tgt} map on the command line like this
        f"+data.text_files.{split}={{src:'{sliced_corpus / f'{split}.en'}',"
        f"tgt:'{sliced_corpus / f'{split}.de'}'}}"
        for split in SPLITS
    ]
    cfg = sliced_config("data.source=text", *files)
    cfg.paths.prepared = str(tmp_path / "text" / "prepared")
    cfg.paths.metrics_dir = str(tmp_path / "text" / "metrics")
    prepare(cfg)
    assert snapshot(Path(cfg.paths.prepared)) == snapshot(Path(reference.paths.prepared))


def test_hf_source_local_dataset(sliced_config, sliced_corpus, tmp_path):
    reference = sliced_config()
    prepare(reference)
    dataset = tmp_path / "hf_dataset"
    dataset.mkdir()
    card = ["---", "configs:", "- config_name: en-de", "  data_files:"]
    for split in SPLITS:
        en = (sliced_corpus / f"{split}.en").read_text("utf-8").split("\n")[:-1]
        de = (sliced_corpus / f"{split}.de").read_text("utf-8").split("\n")[:-1]
        rows = [json.dumps({"translation": {"en": s, "de": t}}) for s, t in zip(en, de)]
        (dataset / f"{split}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
        card += [f"  - split: {split}", f"    path: {split}.jsonl"]
    (dataset / "README.md").write_text("\n".join([*card, "---", ""]), encoding="utf-8")
    cfg = sliced_config("data.source=hf", f"data.hf_path={dataset}", "data.hf_name=en-de")
    cfg.paths.prepared = str(tmp_path / "hf" / "prepared")
    cfg.paths.metrics_dir = str(tmp_path / "hf" / "metrics")
    prepare(cfg, cache_dir=tmp_path / "cache")
    assert snapshot(Path(cfg.paths.prepared)) == snapshot(Path(reference.paths.prepared))
    with pytest.raises(DataError, match=r"no split\(s\) \['dev'\]"):
        prepare(
            sliced_config(
                "data.source=hf",
                f"data.hf_path={dataset}",
                "data.hf_name=en-de",
                "data.val_split=dev",
            ),
            cache_dir=tmp_path / "cache",
        )


@pytest.mark.parametrize("kind", ["symlink loop", "fifo", "file"])
def test_a_corpus_folder_that_is_no_folder_is_named_not_downloaded(make_config, tmp_path, kind):
    """A download is no answer to a `data.raw_dir` that exists but cannot be listed: the error
    names it and what it is, and no request is made (the URL would refuse: port 9)."""
    import os

    raw_dir = tmp_path / "multi30k"
    if kind == "symlink loop":
        raw_dir.symlink_to(raw_dir)
    elif kind == "fifo":
        os.mkfifo(raw_dir)
    else:
        raw_dir.write_text("not a folder\n")
    cfg = make_config(f"data.raw_dir={raw_dir}", "data.url=https://127.0.0.1:9/multi30k")
    with pytest.raises(DataError) as error:
        prepare(cfg, cache_dir=tmp_path / "cache")
    message = str(error.value)
    described = {"symlink loop": "a symbolic link loop", "fifo": "a FIFO", "file": "a file"}
    assert message.startswith(f"data.raw_dir {raw_dir} is {described[kind]}"), message
    assert "download" not in message and not (tmp_path / "cache").exists()
