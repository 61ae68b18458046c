"""LightningDataModule over the tokenized Arrow splits.

Batches are dicts (see CONTRACT):
  src      (B, S) source ids, padded with pad_id
  tgt_in   (B, T) [bos] + y, padded       (decoder input, teacher forcing)
  tgt_out  (B, T) y + [eos], padded       (what the decoder predicts)
  ids      (B,)   example indices within the split (to restore corpus order)
  num_tgt_tokens  int, non-pad tokens in tgt_out
Padding masks are derived from pad_id (`src.eq(pad_id)`).

The training loader is stateful: Lightning 2.6 stores `loader.state_dict()` in every
checkpoint (`fit_loop.on_save_checkpoint` -> `CombinedLoader._state_dicts`) and, on resume,
calls `loader.load_state_dict()` in `FitLoop.setup_data` before creating the iterator; its
fetcher then counts the batches already done and expects the loader to yield only the
rest (`len()` stays the full epoch). The consumed count is taken in the main process, as the
batches leave the loader, not in the batch sampler: with `num_workers > 0` the sampler runs
ahead of training by the prefetched batches.

Under DDP the Trainer must be built with `use_distributed_sampler=False` (the batch sampler
shards by rank itself; Lightning cannot inject a DistributedSampler into it). The evaluation
loaders are not sharded: every rank sees the whole split, so a metric computed on any rank
covers every sentence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.config_schema import Config
from pipeline.data.batching import TokenBatchSampler, eval_batches
from pipeline.data.positions import SOURCE, TARGET, check_fits, longest
from pipeline.data.tokenized import load_tokenized
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import DataError


class TokenizedSplit(Dataset):
    """One split's token ids held as Python lists (fast random access for collate)."""

    def __init__(self, table) -> None:
        columns = table.data  # the Arrow table: one bulk conversion per column
        self.src_ids: list[list[int]] = columns.column("src_ids").to_pylist()
        self.tgt_ids: list[list[int]] = columns.column("tgt_ids").to_pylist()
        self.src_text: list[str] = columns.column("src_text").to_pylist()
        self.tgt_text: list[str] = columns.column("tgt_text").to_pylist()

    def __len__(self) -> int:
        return len(self.src_ids)

    def __getitem__(self, index: int) -> tuple[int, list[int], list[int]]:
        return index, self.src_ids[index], self.tgt_ids[index]


class Collate:
    """Pad a list of (index, src_ids, tgt_ids) into the batch dict; picklable for workers."""

    def __init__(self, pad_id: int, bos_id: int, eos_id: int) -> None:
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __call__(self, examples: Sequence[tuple[int, list[int], list[int]]]) -> dict:
        batch_size = len(examples)
        src_len = max(len(src) for _, src, _ in examples)
        tgt_len = max(len(tgt) for _, _, tgt in examples) + 1  # + bos / + eos
        src = torch.full((batch_size, src_len), self.pad_id, dtype=torch.long)
        tgt_in = torch.full((batch_size, tgt_len), self.pad_id, dtype=torch.long)
        tgt_out = torch.full((batch_size, tgt_len), self.pad_id, dtype=torch.long)
        for row, (_, src_ids, tgt_ids) in enumerate(examples):
            src[row, : len(src_ids)] = torch.tensor(src_ids, dtype=torch.long)
            tgt_in[row, : len(tgt_ids) + 1] = torch.tensor([self.bos_id, *tgt_ids])
            tgt_out[row, : len(tgt_ids) + 1] = torch.tensor([*tgt_ids, self.eos_id])
        return {
            "src": src,
            "tgt_in": tgt_in,
            "tgt_out": tgt_out,
            "ids": torch.tensor([index for index, _, _ in examples], dtype=torch.long),
            "num_tgt_tokens": sum(len(tgt) + 1 for _, _, tgt in examples),
        }


class ResumableDataLoader(DataLoader):
    """A DataLoader over a TokenBatchSampler whose position can be saved and restored.

    `state_dict()` reports the batches that have left this loader (counted here, in the main
    process), so prefetching workers never make a resume skip batches.
    """

    batch_sampler: TokenBatchSampler

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delivered: int | None = None  # batches of `_delivered_epoch` handed out so far
        self._delivered_epoch: int | None = None

    def __iter__(self) -> Iterator[dict]:
        # A generator: nothing starts (no workers, no sampler pass) until the first batch is
        # requested, i.e. after Lightning has called set_epoch for this epoch.
        sampler = self.batch_sampler
        self._delivered, self._delivered_epoch = sampler.start_position(), sampler.epoch
        for batch in super().__iter__():
            self._delivered += 1
            yield batch

    def state_dict(self) -> dict:
        state = self.batch_sampler.state_dict()
        if self._delivered is not None and self._delivered_epoch == state["epoch"]:
            state["consumed"] = self._delivered
        return state

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
        self._delivered = self._delivered_epoch = None


class TranslationDataModule(L.LightningDataModule):
    """Train/val/test loaders over `cfg.paths.tokenized` (see the module docstring)."""

    def __init__(self, cfg: Config, pin_memory: bool = False) -> None:
        """`pin_memory`: batches in page-locked host memory (training on a GPU), so that the
        copies Lightning makes with `non_blocking=True` overlap the previous step."""
        super().__init__()
        self.cfg = cfg
        self.pin_memory = pin_memory
        self.tokenizer: Tokenizer | None = None
        self.splits: dict[str, TokenizedSplit] = {}
        self.train_sampler: TokenBatchSampler | None = None

    # ---- data --------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        tokenized = Path(self.cfg.paths.tokenized)
        self.tokenizer = Tokenizer.for_data(tokenized / MODEL_FILE, self.cfg.data)
        self._check_special_ids()
        loaded = load_tokenized(tokenized, source_eos=self.cfg.data.tokenizer.source_eos)
        self.splits = {name: TokenizedSplit(table) for name, table in loaded.items()}

    def _check_special_ids(self) -> None:
        tok, want = self.tokenizer, self.cfg.data.tokenizer
        got = (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id)
        if got != (want.pad_id, want.unk_id, want.bos_id, want.eos_id):
            raise DataError(
                f"{self.cfg.paths.tokenized}/{MODEL_FILE}: special ids (pad, unk, bos, eos)={got} "
                f"differ from data.tokenizer {(want.pad_id, want.unk_id, want.bos_id, want.eos_id)}; "
                "re-run `dvc repro tokenize`"
            )

    def check_max_positions(self, names: Sequence[str], sources: Sequence[str] = ()) -> None:
        """Refuse a model whose position table cannot hold these splits (a ConfigError before
        any training, not one at the first batch that is too long): the encoder reads
        `src_len` positions, the decoder `tgt_len + 1` ([bos] + y, y + [eos]). Of `sources`
        (the splits evaluation decodes) only the sources: their targets are references."""
        sides = []
        for name in dict.fromkeys([*names, *sources]):
            split = self.split(name)
            sides.append((name, SOURCE, split.src_ids))
            if name in names:
                sides.append((name, TARGET, split.tgt_ids))
        check_fits(self.cfg, self.cfg.model.max_positions, longest(sides))

    @property
    def vocab_size(self) -> int:
        self.setup()
        return self.tokenizer.vocab_size

    def split(self, name: str) -> TokenizedSplit:
        self.setup()
        if name not in self.splits:
            raise DataError(
                f"split '{name}' not in {self.cfg.paths.tokenized} (it has {sorted(self.splits)}); "
                "check eval.splits / data.test_splits and re-run `dvc repro tokenize`"
            )
        return self.splits[name]

    def _collate(self) -> Collate:
        tok = self.tokenizer
        return Collate(tok.pad_id, tok.bos_id, tok.eos_id)

    def _replicas(self) -> tuple[int, int]:
        """(world size, rank) from the attached Trainer; (1, 0) without one."""
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    # ---- loaders -----------------------------------------------------------------------

    def train_dataloader(self) -> ResumableDataLoader:
        dataset = self.split(self.cfg.data.train_split)
        num_replicas, rank = self._replicas()
        self.train_sampler = TokenBatchSampler(
            [len(ids) for ids in dataset.src_ids],
            [len(ids) for ids in dataset.tgt_ids],
            self.cfg.train.max_tokens,
            seed=self.cfg.seed,
            num_replicas=num_replicas,
            rank=rank,
            batches_per_update=self.cfg.train.accumulate_grad_batches,
            budget=self.cfg.train.batch_budget,
        )
        workers = self.cfg.train.num_workers
        return ResumableDataLoader(
            dataset,
            batch_sampler=self.train_sampler,
            collate_fn=self._collate(),
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=self.pin_memory,
        )

    def dataloader_for_split(self, name: str) -> DataLoader:
        """Deterministic loader over a whole split, batched by eval.max_tokens source tokens."""
        dataset = self.split(name)
        batches = eval_batches([len(ids) for ids in dataset.src_ids], self.cfg.eval.max_tokens)
        return DataLoader(dataset, batch_sampler=batches, collate_fn=self._collate(),
                          pin_memory=self.pin_memory)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return self.dataloader_for_split(self.cfg.data.val_split)

    def test_dataloader(self) -> list[DataLoader]:
        return [self.dataloader_for_split(name) for name in self.cfg.data.test_splits]
