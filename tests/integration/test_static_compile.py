"""The static path through torch.compile (``StaticRunner(compile=True)``, the server's
``--enable-torch-compile``), on CPU: what the GPU captures after compiling, run eagerly (inductor's CPU
code instead of Triton; the same traced graph: the attention as one opaque op that writes the caches
in place, the elementwise work fused). The GPU tier checks compiled graph replays == compiled eager.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spec_decode.engines.embedded.decoding import Decoder  # noqa: E402
from spec_decode.engines.embedded.graphs import StaticRunner  # noqa: E402

from .engine_args import tiny_models  # noqa: E402
from .test_engine_batching import workload  # noqa: E402

pytestmark = pytest.mark.integration
STEPS = 3
TOKENS = 60


def test_compiled_static_shapes_decode_like_the_uncompiled_ones():
    """Speculative (verify, draft, re-extend shapes): the compiled path commits the same tokens as the
    uncompiled static path, up to near-ties (inductor rounds fused fp32 work once), accepts like it, and
    really ran compiled code (dynamo made graphs, with no break: fullgraph)."""
    from torch._dynamo.utils import counters

    target, drafter = tiny_models(threads=1)
    prompts = [ids for ids, _ in workload()[:2]]
    plain = Decoder(target, drafter, STEPS, StaticRunner(target, drafter, STEPS, use_graphs=False))
    before = counters["stats"]["unique_graphs"]
    compiled = Decoder(target, drafter, STEPS, StaticRunner(target, drafter, STEPS, use_graphs=False, compile=True))
    for ids in prompts:
        want, got = plain.generate(ids, TOKENS), compiled.generate(ids, TOKENS)
        same = sum(a == b for a, b in zip(want.output_ids, got.output_ids)) / len(want.output_ids)
        assert got.output_ids[:20] == want.output_ids[:20] and same > 0.9, f"agreement {same:.2f}"
        assert got.verify_ct <= 1.2 * want.verify_ct
    assert counters["stats"]["unique_graphs"] - before >= 3  # verify@1, draft@1, extend@1
