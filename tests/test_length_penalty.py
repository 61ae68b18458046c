import subprocess
import sys

import pytest

from pipeline import config as config_lib
from pipeline.model.length_penalty import LENGTH_NORMALIZATIONS, length_normalizer


def test_each_normalization_is_its_formula():
    assert length_normalizer(3, 2.0) == pytest.approx((8 / 6) ** 2)  # GNMT, the default
    assert length_normalizer(3, 2.0, "gnmt") == pytest.approx((8 / 6) ** 2)
    assert length_normalizer(3, 2.0, "fairseq") == pytest.approx(9.0)
    for normalization in LENGTH_NORMALIZATIONS:
        assert length_normalizer(7, 0.0, normalization) == 1.0  # alpha 0: summed log-prob


@pytest.mark.parametrize("normalization", sorted(LENGTH_NORMALIZATIONS))
def test_config_accepts_every_normalization_decoding_has(normalization):
    cfg = config_lib.compose([f"eval.length_normalization={normalization}"])
    assert cfg.eval.length_normalization == normalization


def test_config_validates_the_names_without_importing_torch():
    # Validation runs before any compute, in stages that must start fast: no torch import.
    code = "import sys, pipeline.config; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=300).returncode == 0
