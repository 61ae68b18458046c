"""pipeline.data.positions: a sentence longer than the model's position table is refused,
naming the longest one, over any splits, sides and lengths."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import config as config_lib
from pipeline.data.batching import TARGET_SPECIALS
from pipeline.data.positions import SOURCE, TARGET, check_fits, longest
from pipeline.errors import ConfigError

SPLITS = ("train", "val", "test_2016_flickr")
sides = st.lists(
    st.tuples(
        st.sampled_from(SPLITS),
        st.sampled_from((SOURCE, TARGET)),
        st.lists(st.lists(st.integers(0, 9), max_size=12), max_size=6),
    ),
    max_size=5,
)


@pytest.fixture(scope="module")
def cfg():
    return config_lib.compose(["experiment=smoke"])


@settings(max_examples=200, deadline=None)
@given(sides=sides, limit=st.integers(0, 14))
def test_refused_exactly_when_the_longest_needs_more_positions_than_the_limit(cfg, sides, limit):
    needs = [
        (len(ids) + (TARGET_SPECIALS if side == TARGET else 0), split, index, side)
        for split, side, sequences in sides
        for index, ids in enumerate(sequences)
    ]
    worst = longest(sides)
    if not needs:
        assert worst is None
        check_fits(cfg, limit, worst)
        return
    most = max(n[0] for n in needs)
    assert tuple(worst) == next(n for n in needs if n[0] == most)  # the first of equals
    if most <= limit:
        check_fits(cfg, limit, worst)
        return
    with pytest.raises(ConfigError) as refused:
        check_fits(cfg, limit, worst)
    message = str(refused.value)
    assert message.startswith(
        f"config key 'model.max_positions'={limit} is shorter than the data: split "
        f"'{worst.split}' example {worst.index} has a {worst.side} of {most} positions"
    )
    if worst.split in cfg.data.filter.apply_to:
        assert f"drop long pairs of '{worst.split}'" in message
        return
    if worst.split != cfg.data.train_split:  # tokenize drops no row of it: row = line
        assert f"(line {worst.index + 1} of " in message
    # a test split is never offered the filter: filtered, it would not be the benchmark
    offered = "data.filter.apply_to" in message
    assert offered == (worst.split not in cfg.data.test_splits)
