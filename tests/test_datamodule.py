"""TranslationDataModule: batch contents, eval loaders, and exact mid-epoch resume through a
real Lightning Trainer (checkpoint -> new Trainer -> fit(ckpt_path=...))."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from pipeline.data.datamodule import TranslationDataModule
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import ConfigError


@pytest.fixture
def datamodule(tokenized_smoke) -> TranslationDataModule:
    dm = TranslationDataModule(tokenized_smoke)
    dm.setup("fit")
    return dm


def test_batches_follow_the_contract(datamodule, tokenized_smoke):
    tok = Tokenizer.load(Path(tokenized_smoke.paths.tokenized) / MODEL_FILE)
    train = datamodule.split("train")
    for batch in list(datamodule.train_dataloader())[:5]:
        src, tgt_in, tgt_out, ids = batch["src"], batch["tgt_in"], batch["tgt_out"], batch["ids"]
        assert src.dtype == tgt_in.dtype == tgt_out.dtype == ids.dtype == torch.long
        assert tgt_in.shape == tgt_out.shape and src.shape[0] == tgt_in.shape[0] == len(ids)
        assert batch["num_tgt_tokens"] == int(tgt_out.ne(tok.pad_id).sum())
        for row, index in enumerate(ids.tolist()):
            src_ids, tgt_ids = train.src_ids[index], train.tgt_ids[index]
            n = len(tgt_ids)
            assert src[row].tolist() == src_ids + [tok.pad_id] * (src.shape[1] - len(src_ids))
            assert tgt_in[row].tolist() == [tok.bos_id, *tgt_ids] + [tok.pad_id] * (
                tgt_in.shape[1] - n - 1
            )
            assert tgt_out[row].tolist() == [*tgt_ids, tok.eos_id] + [tok.pad_id] * (
                tgt_out.shape[1] - n - 1
            )
            assert tok.decode(src[row].tolist()) == train.src_text[index]
        padded = src.numel() + tgt_in.numel()
        assert padded <= tokenized_smoke.train.max_tokens


def test_eval_loaders_cover_each_split_once(datamodule, tokenized_smoke):
    budget = tokenized_smoke.eval.max_tokens
    for name, loader in [("val", datamodule.val_dataloader())] + list(
        zip(tokenized_smoke.data.test_splits, datamodule.test_dataloader())
    ):
        batches = list(loader)
        ids = torch.cat([b["ids"] for b in batches]).tolist()
        assert sorted(ids) == list(range(len(datamodule.split(name))))
        assert all(b["src"].numel() <= budget for b in batches)
        assert [b["ids"].tolist() for b in loader] == [b["ids"].tolist() for b in batches]
    with pytest.raises(Exception, match="split 'test_2017' not in"):
        datamodule.dataloader_for_split("test_2017")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_counts_delivered_batches_not_prefetched(tokenized_smoke, num_workers):
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.train.num_workers = num_workers
    dm = TranslationDataModule(cfg)
    loader = dm.train_dataloader()
    full = [b["ids"].tolist() for b in loader]
    iterator = iter(loader)
    first = [next(iterator)["ids"].tolist() for _ in range(7)]
    state = loader.state_dict()
    assert state["consumed"] == 7
    if num_workers:
        assert loader.batch_sampler.consumed > 7  # the workers' prefetch ran ahead
    del iterator
    resumed = TranslationDataModule(cfg).train_dataloader()
    resumed.load_state_dict(state)
    assert first + [b["ids"].tolist() for b in resumed] == full
    assert len(resumed) == len(full)  # len() is the whole epoch (Lightning counts the rest)


class RecordingModule(L.LightningModule):
    """The smallest trainable module: records which examples each step saw."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch["ids"].tolist()))
        return (self.weight * batch["src"].float().mean()).sum() + self.weight.square().sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(cfg, root: Path, max_steps: int, ckpt_path: str | None = None, every: int | None = None):
    module = RecordingModule()
    callbacks = (
        [ModelCheckpoint(dirpath=root, every_n_train_steps=every, save_top_k=-1)] if every else []
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(every),
        callbacks=callbacks,
        use_distributed_sampler=False,
        default_root_dir=root,
    )
    trainer.fit(module, datamodule=TranslationDataModule(cfg), ckpt_path=ckpt_path)
    return module.seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_resume_mid_epoch_continues_exactly(tokenized_smoke, tmp_path, num_workers):
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.train.num_workers = num_workers
    per_epoch = len(TranslationDataModule(cfg).train_dataloader())
    every = per_epoch // 2 + 3  # checkpoints in the middle of epoch 0 and of epoch 1
    total = 2 * every + 5
    assert every < per_epoch < 2 * every < total < 2 * per_epoch
    uninterrupted = fit(cfg, tmp_path / "a", total, every=every)
    assert len(uninterrupted) == total
    # Epoch 1 uses its own batch order: Lightning's set_epoch reached the sampler.
    assert [ids for epoch, ids in uninterrupted if epoch == 1][:5] != [
        ids for _, ids in uninterrupted[:5]
    ]
    for step in (every, 2 * every):
        checkpoint = next((tmp_path / "a").glob(f"*step={step}.ckpt"))
        state = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]
        assert state["combined_loader"][0]["consumed"] == step % per_epoch
        resumed = fit(cfg, tmp_path / f"b{step}", total, ckpt_path=str(checkpoint))
        assert uninterrupted[:step] + resumed == uninterrupted, f"resume from step {step}"


@pytest.mark.slow  # two spawned processes: ~50 s on 2 shared cores
def test_ddp_two_ranks_see_each_example_once(tokenized_smoke, tmp_path):
    """Two CPU processes (gloo): disjoint shards covering the training split, equal lengths."""
    cfg = copy.deepcopy(tokenized_smoke)
    module = ShardRecorder(str(tmp_path))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=TranslationDataModule(cfg))
    shards = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(shards[0]) == len(shards[1])
    seen = [i for shard in shards for batch in shard for i in batch]
    assert sorted(seen) == list(range(len(TranslationDataModule(cfg).split("train"))))


class ShardRecorder(RecordingModule):
    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir

    def on_train_end(self) -> None:
        ids = [batch for _, batch in self.seen]
        Path(self.out_dir, f"rank{self.global_rank}.json").write_text(json.dumps(ids))


def _longest(tokenized_smoke, split_names) -> tuple[int, str, int, str]:
    """(positions, split, example, side) of the longest sequence, read from the saved
    `src_len`/`tgt_len` columns (a target needs one more position: bos/eos)."""
    import datasets

    saved = datasets.load_from_disk(str(Path(tokenized_smoke.paths.tokenized) / "splits"))
    worst = (0, "", -1, "")
    for name in split_names:
        for side, column, extra in (("source", "src_len", 0), ("target", "tgt_len", 1)):
            for index, length in enumerate(saved[name][column]):
                if length + extra > worst[0]:
                    worst = (length + extra, name, index, side)
    return worst


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_max_positions_shorter_than_the_data_is_refused_naming_split_and_length(
    tokenized_smoke, positional
):
    names = ["train", "val"]
    positions, split, index, side = _longest(tokenized_smoke, names)
    cfg = copy.deepcopy(tokenized_smoke)
    cfg.model.positional = positional
    cfg.model.max_positions = positions  # exactly enough
    dm = TranslationDataModule(cfg)
    dm.check_max_positions(names)
    cfg.model.max_positions = positions - 1
    with pytest.raises(ConfigError) as refused:
        dm.check_max_positions(names)
    assert str(refused.value).startswith(
        f"config key 'model.max_positions'={positions - 1} is shorter than the data: split "
        f"'{split}' example {index} has a {side} of {positions} positions"
    )
    assert f"at least {positions}" in str(refused.value)


def test_loaders_pin_memory_only_when_asked(tokenized_smoke):
    """Training on a GPU pins batches (the trainer asks for it there), so that Lightning's
    non-blocking copies overlap the step; on a CPU pinning would only cost."""
    assert not TranslationDataModule(tokenized_smoke).val_dataloader().pin_memory
    pinned = TranslationDataModule(tokenized_smoke, pin_memory=True)
    pinned.setup("fit")
    assert pinned.train_dataloader().pin_memory and pinned.val_dataloader().pin_memory
