"""TokenBatchSampler and eval batching on the real Multi30k training split (joint BPE 8000)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

from pipeline.data.batching import (
    TokenBatchSampler,
    eval_batches,
    pack_greedy,
    pack_min_padding,
    split_to_multiple,
)
from pipeline.data.tokenized import load_tokenized
from pipeline.errors import DataError

MAX_TOKENS = 4096


@pytest.fixture(scope="module")
def lengths(tokenized_multi30k) -> tuple[np.ndarray, np.ndarray]:
    train = load_tokenized(tokenized_multi30k.paths.tokenized)["train"]
    return np.array(train["src_len"][:]), np.array(train["tgt_len"][:])


def make(lengths, **kwargs) -> TokenBatchSampler:
    src, tgt = lengths
    options = {"max_tokens": MAX_TOKENS, "seed": 1234} | kwargs
    return TokenBatchSampler(src, tgt, options.pop("max_tokens"), **options)


def padded(batch, src, tgt) -> int:
    """Independent statement of the budget: padded source + padded target with bos/eos."""
    return len(batch) * (max(src[i] for i in batch) + max(tgt[i] + 1 for i in batch))


def test_no_batch_over_budget_and_padding_is_small(lengths):
    src, tgt = lengths
    sampler = make(lengths)
    batches = list(sampler)
    assert all(padded(b, src, tgt) <= MAX_TOKENS for b in batches)
    real = int(src.sum() + (tgt + 1).sum())
    total = sum(padded(b, src, tgt) for b in batches)
    padding = 1 - real / total
    print(f"padding {padding:.2%} of {total} tokens in {len(batches)} batches")
    assert padding < 0.05
    # Batches are full: the mean batch uses most of the budget.
    assert total / len(batches) > 0.95 * MAX_TOKENS


def padding_fraction(batches, src, tgt) -> float:
    real = sum(int(src[i]) + int(tgt[i]) + 1 for b in batches for i in b)
    return 1 - real / sum(padded(b, src, tgt) for b in batches)


def fairseq_batch_by_size(order, num_tokens, max_tokens) -> list[list[int]]:
    """fairseq's `data_utils.batch_by_size` (required_batch_size_multiple 1), restated: add
    examples while (B + 1) * the longest num_tokens so far stays within max_tokens."""
    batches, batch, longest = [], [], 0
    for index in order:
        grown = max(longest, num_tokens[index])
        if batch and (len(batch) + 1) * grown > max_tokens:
            batches.append(batch)
            batch, grown = [], num_tokens[index]
        batch.append(int(index))
        longest = grown
    return batches + [batch] if batch else batches


def test_max_budget_is_fairseqs_max_tokens(lengths):
    """Under train.batch_budget "max", greedy filling makes fairseq's batches
    (LanguagePairDataset.num_tokens: max(source, target) with eos), and the sampler's cuts keep
    their number while staying within the same bound."""
    src, tgt = lengths
    sampler = make(lengths, budget="max")
    order = np.concatenate(sampler.batches)
    with_eos = tgt + 1
    reference = fairseq_batch_by_size(order, np.maximum(src, with_eos), MAX_TOKENS)
    greedy = pack_greedy(order, src, with_eos, MAX_TOKENS, budget="max")
    assert greedy == reference
    assert len(sampler.batches) == len(reference)
    assert all(padded_as_given(b, src, with_eos, "max") <= MAX_TOKENS for b in sampler.batches)
    # The same number bounds one side's padded tokens instead of both sides' ("sum"): nearly
    # twice the examples per batch, so nearly half the batches (both sides are as long).
    assert 1.6 < len(make(lengths).batches) / len(sampler.batches) < 2.0


def test_snake_order_pads_less_than_a_plain_length_sort(lengths):
    """At the tiny recipe's budget (8192) a batch spans several source lengths; sorting the
    target length in alternating directions keeps the seams between them short."""
    src, tgt = lengths
    snake = padding_fraction(make(lengths, max_tokens=8192).batches, src, tgt)
    plain_order = np.lexsort((tgt, src))
    plain = padding_fraction(pack_greedy(plain_order, src.tolist(), tgt.tolist(), 8192), src, tgt)
    print(f"padding at 8192 tokens: snake {snake:.2%}, plain sort {plain:.2%}")
    assert snake < 0.8 * plain
    assert snake < 0.05


def partition_cost(batches, src, tgt, max_tokens, budget="sum") -> int:
    """`pack_min_padding`'s objective, stated independently: padded tokens + max_tokens per batch."""
    return sum(padded_as_given(b, src, tgt, budget) for b in batches) + max_tokens * len(batches)


def padded_as_given(batch, src, tgt, budget="sum") -> int:
    """`padded` for lengths that already count bos/eos (what the packing functions take); under
    fairseq's budget ("max") the longer side's padded tokens, B * max(max src, max tgt)."""
    longest_src, longest_tgt = max(src[i] for i in batch), max(tgt[i] for i in batch)
    if budget == "max":
        return len(batch) * max(longest_src, longest_tgt)
    return len(batch) * (longest_src + longest_tgt)


@pytest.mark.parametrize("budget", ["sum", "max"])
@pytest.mark.parametrize("seed", range(6))
def test_min_padding_cuts_are_optimal_against_exhaustive_search(seed, budget):
    """Every way of cutting 11 examples into consecutive within-budget batches (2^10 of them)
    is scored; the dynamic programme finds one with the least cost."""
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(1, 12, size=11), rng.integers(1, 12, size=11)
    order = rng.permutation(11)
    max_tokens = 40 if budget == "sum" else 24
    best = None
    for cuts in itertools.product([False, True], repeat=10):
        batches, current = [], [int(order[0])]
        for cut, index in zip(cuts, order[1:]):
            if cut:
                batches.append(current)
                current = []
            current.append(int(index))
        batches.append(current)
        if all(len(b) == 1 or padded_as_given(b, src, tgt, budget) <= max_tokens for b in batches):
            cost = partition_cost(batches, src, tgt, max_tokens, budget)
            best = cost if best is None else min(best, cost)
    packed = pack_min_padding(order, src, tgt, max_tokens, budget)
    assert [i for b in packed for i in b] == order.tolist()  # consecutive, order kept
    assert all(len(b) == 1 or padded_as_given(b, src, tgt, budget) <= max_tokens for b in packed)
    assert partition_cost(packed, src, tgt, max_tokens, budget) == best


@pytest.mark.parametrize("max_tokens", [4096, 8192])
def test_min_padding_cuts_pad_less_than_greedy_with_as_many_batches(lengths, max_tokens):
    src, tgt = lengths
    sampler = make(lengths, max_tokens=max_tokens)
    greedy = pack_greedy(
        np.concatenate(sampler.batches), sampler.src_lens, sampler.tgt_lens, max_tokens
    )
    ours, theirs = (padding_fraction(b, src, tgt) for b in (sampler.batches, greedy))
    print(f"padding at {max_tokens}: cuts placed {ours:.2%}, greedy {theirs:.2%}")
    assert len(sampler.batches) == len(greedy)
    assert ours < theirs


@pytest.mark.parametrize("num_replicas", [1, 2, 3])
def test_each_example_exactly_once_per_epoch_over_ranks(lengths, num_replicas):
    src, tgt = lengths
    for epoch in (0, 1):
        per_rank = []
        for rank in range(num_replicas):
            sampler = make(lengths, num_replicas=num_replicas, rank=rank)
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
            assert len(per_rank[-1]) == len(sampler)
        assert len({len(batches) for batches in per_rank}) == 1  # equal batch counts
        seen = [i for batches in per_rank for batch in batches for i in batch]
        assert sorted(seen) == list(range(len(src)))  # all, once: disjoint and complete
        assert all(padded(b, src, tgt) <= MAX_TOKENS for bs in per_rank for b in bs)


def test_split_to_multiple_splits_the_largest_batches():
    batches = [[0, 1, 2, 3], [4], [5, 6], [7, 8, 9, 10, 11]]
    result = split_to_multiple(batches, 3)  # 4 batches -> 6: the 5-batch, then the 4-batch
    assert result == [[0, 1], [2, 3], [4], [5, 6], [7, 8], [9, 10, 11]]
    with pytest.raises(DataError, match="only 2 training examples"):
        split_to_multiple([[0], [1]], 3)


@pytest.mark.parametrize(("num_replicas", "batches_per_update"), [(1, 2), (1, 3), (2, 2)])
def test_every_rank_gets_whole_updates_of_batches(lengths, num_replicas, batches_per_update):
    """Gradient accumulation: each rank's epoch is a whole number of updates (so no optimizer
    step sums fewer batches), every example still once, every batch within budget."""
    src, tgt = lengths
    plain = len(make(lengths).batches)
    per_rank = []
    for rank in range(num_replicas):
        sampler = make(lengths, num_replicas=num_replicas, rank=rank,
                       batches_per_update=batches_per_update)  # fmt: skip
        assert len(sampler) % batches_per_update == 0
        per_rank.append(list(sampler))
    total = sum(map(len, per_rank))
    assert plain <= total < plain + num_replicas * batches_per_update  # only what it takes
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert sorted(seen) == list(range(len(src)))
    assert all(padded(b, src, tgt) <= MAX_TOKENS for bs in per_rank for b in bs)


def test_batch_order_is_shuffled_per_epoch_from_the_seed(lengths):
    sampler = make(lengths)
    epoch0 = list(sampler)
    assert list(sampler) == epoch0  # same epoch, same order
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    assert sorted(map(tuple, epoch1)) == sorted(map(tuple, epoch0))  # same partition
    assert list(make(lengths, seed=1234)) == epoch0
    assert list(make(lengths, seed=99)) != epoch0


def test_lightning_set_epoch_reaches_the_batch_sampler(lengths):
    """Lightning only calls set_epoch on loader.sampler and loader.batch_sampler.sampler."""
    sampler = make(lengths)
    loader = DataLoader(range(len(lengths[0])), batch_sampler=sampler)
    _set_sampler_epoch(loader, 3)
    assert sampler.epoch == 3
    assert list(sampler) == sampler.epoch_batches(3)


@pytest.mark.parametrize(("num_replicas", "rank"), [(1, 0), (2, 1)])
def test_state_dict_resumes_mid_epoch_exactly(lengths, num_replicas, rank):
    reference = make(lengths, num_replicas=num_replicas, rank=rank)
    reference.set_epoch(2)
    full = list(reference)
    running = make(lengths, num_replicas=num_replicas, rank=rank)
    running.set_epoch(2)
    iterator = iter(running)
    done = [next(iterator) for _ in range(37)]
    state = running.state_dict()
    assert state["epoch"] == 2 and state["consumed"] == 37
    resumed = make(lengths, num_replicas=num_replicas, rank=rank)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # what Lightning does after loading: same epoch, position kept
    assert done + list(resumed) == full
    # After a finished epoch the next pass starts from the top (of the new epoch).
    resumed.set_epoch(3)
    assert list(resumed) == resumed.epoch_batches(3)


def test_changed_layout_restarts_the_epoch_with_a_warning(lengths):
    sampler = make(lengths)
    iterator = iter(sampler)
    next(iterator)
    state = sampler.state_dict()
    other = make(lengths, max_tokens=2048)
    with pytest.warns(UserWarning, match="restarting epoch 0"):
        other.load_state_dict(state)
    assert list(other) == other.epoch_batches(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(lengths).load_state_dict(state)  # same layout: silent


def test_example_over_budget_is_named(lengths):
    src, tgt = lengths
    src = src.copy()
    src[123] = 5000
    with pytest.raises(DataError, match=r"training example 123 alone needs 5\d+ tokens"):
        TokenBatchSampler(src, tgt, MAX_TOKENS, seed=0)


def test_eval_batches_cover_every_example_in_length_order(lengths):
    src, _ = lengths
    budget = 2048
    batches = eval_batches(src, budget)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(src)))
    assert [src[i] for i in flat] == sorted(src)
    assert all(len(b) * max(src[i] for i in b) <= budget for b in batches)
    # An example longer than the budget still gets evaluated, alone.
    assert eval_batches([3, 50, 4], 20) == [[0, 2], [1]]
