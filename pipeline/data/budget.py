"""How a padded training batch is held to `train.max_tokens` (`train.batch_budget`): the width
a batch of B examples pays per example, from its longest source and longest target (targets
counted with their bos/eos), so that B * width <= max_tokens. Free of torch, so that
`pipeline.config` validates the name against these without importing the data pipeline."""

from __future__ import annotations

import numpy as np

BATCH_BUDGETS = {
    # both sides' padded tokens, B * (max_src + max_tgt): section 5.1's batches are counted in
    # source and target tokens
    "sum": np.add,
    # fairseq's --max-tokens, B * max(max_src, max_tgt) (LanguagePairDataset.num_tokens): each
    # side up to max_tokens, so about twice the padded tokens of "sum" at the same number
    "max": np.maximum,
}
