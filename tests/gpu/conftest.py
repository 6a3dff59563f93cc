"""Shared by the GPU tests (marker `gpu`, never in CI)."""

from __future__ import annotations

import pytest

from spec_decode.core.synthetic import SyntheticConfig
from spec_decode.engines.embedded import synthetic


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory):
    """A small synthetic target (grouped-query, 4 layers) and drafter in bf16, seeded, on the GPU."""
    root = tmp_path_factory.mktemp("bf16_pair")
    shape = dict(vocab_size=256, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512)
    tsyn = SyntheticConfig(num_hidden_layers=4, max_position_embeddings=512, **shape)
    dsyn = SyntheticConfig(num_hidden_layers=1, max_position_embeddings=512, seed=1, **shape)
    synthetic.generate_target(tsyn, root / "target", "cuda")
    synthetic.generate_drafter(dsyn, tsyn, None, root / "drafter", "cuda")
    return root / "target", root / "drafter"
