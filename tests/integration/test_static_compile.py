"""The static path through torch.compile (``StaticRunner(compile=True)``, the server's
``--enable-torch-compile``), on CPU: the graphs dynamo traces from every shape (whole: fullgraph; the
attention one opaque op that writes the caches in place) run through AOTAutograd's functionalization,
as under inductor, but executed eagerly (``aot_eager``): inductor's CPU code generation cost ~25 s of
a CI run here. The GPU tier runs inductor itself: compiled graph replays == compiled eager, and
agreement with the uncompiled path (tests/gpu/test_engine_graphs.py).
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
    """Speculative (verify, draft, re-extend shapes): the traced path commits the same tokens as the
    uncompiled static path (up to near-ties, as inductor's fused rounding may give), accepts like it, and
    really ran traced code (dynamo made graphs, with no break: fullgraph)."""
    from torch._dynamo.utils import counters

    target, drafter = tiny_models(threads=1)
    prompts = [ids for ids, _ in workload()[:2]]
    plain = Decoder(target, drafter, STEPS, StaticRunner(target, drafter, STEPS, use_graphs=False))
    before = counters["stats"]["unique_graphs"]
    runner = StaticRunner(target, drafter, STEPS, use_graphs=False, compile=True, compile_backend="aot_eager")
    compiled = Decoder(target, drafter, STEPS, runner)
    for ids in prompts:
        want, got = plain.generate(ids, TOKENS), compiled.generate(ids, TOKENS)
        same = sum(a == b for a, b in zip(want.output_ids, got.output_ids)) / len(want.output_ids)
        assert got.output_ids[:20] == want.output_ids[:20] and same > 0.9, f"agreement {same:.2f}"
        assert got.verify_ct <= 1.2 * want.verify_ct
    assert counters["stats"]["unique_graphs"] - before >= 3  # verify@1, draft@1, extend@1


def test_slot_attention_is_refused_where_it_cannot_run():
    """slot_attention's Triton kernels ("slots", the compiled default on CUDA for bf16/fp16): on this CPU
    (no Triton in the CPU wheel, fp32 tiny models) a request for them names why, before any shape runs;
    the compiled default falls back to the masked attention."""
    target, drafter = tiny_models(threads=1)
    for attention in ("slots", "slots1"):
        with pytest.raises(ValueError, match=rf"attention '{attention}' (needs Triton|runs on CUDA only|is for bf16)"):
            StaticRunner(target, None, 0, use_graphs=False, graph_ops=True, attention=attention)
    assert StaticRunner(target, None, 0, use_graphs=False, graph_ops=True, compile=True).attention == "bmm"


def layer_inputs(target, i: int, seed: int, t: int = 3):
    """Layer ``i`` of the target, a seeded attention output (1, heads, t, hd) and hidden rows (1, t, h) for
    it, and the generator (for further draws)."""
    layer = target.model.layers[i]
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(1, layer.self_attn.nh, t, layer.self_attn.hd, generator=g)
    return layer, a, torch.randn(1, t, target.shape.hidden_size, generator=g), g


def test_dense_row_parallel_products_equal_the_unit_sums():
    """The compiled tp-1 path's o_proj and down_proj as one GEMM over the units (``dense``) compute what
    the per-unit partials and their tree sum compute, up to fp32 rounding: the units' order and the
    heads' order within them agree with out_partials / partials; q/k/v on x spread per unit as broadcast."""
    from spec_decode.engines.embedded.parallel import tree_sum

    target, _ = tiny_models(threads=1)
    layer, a, x, _ = layer_inputs(target, 2, seed=0)
    with torch.no_grad():
        assert torch.allclose(layer.self_attn.out_dense(a), tree_sum(layer.self_attn.out_partials(a)), atol=1e-5)
        assert torch.allclose(layer.mlp.dense(x), tree_sum(layer.mlp.partials(x)), atol=1e-5)
        cos, sin = target.cos[:3], target.sin[:3]
        for want, got in zip(layer.self_attn.qkv_sharded(x, cos, sin), layer.self_attn.qkv_sharded(x, cos, sin, True)):
            assert torch.allclose(want, got, atol=1e-6)  # q/k/v on x spread per unit: the same products


@pytest.mark.parametrize("s", [2, 4])
def test_split_row_parallel_products_sum_to_the_dense_ones(s):
    """``split`` (a variant of the compiled tp-1 path): o_proj and down_proj as ``s`` fp32 partials over
    consecutive input chunks, whose sum is the dense product; and a compiled runner with it decodes like
    the one without (its graphs traced whole, the sum inside them)."""
    from spec_decode.engines.embedded.layers import split_k

    target, drafter = tiny_models(threads=1)
    layer, a, x, g = layer_inputs(target, 1, seed=1)
    with torch.no_grad():
        parts = layer.self_attn.out_split(a, s)
        assert parts.shape == (s, 3, target.shape.hidden_size) and parts.dtype == torch.float32
        assert torch.allclose(parts.sum(0), layer.self_attn.out_dense(a), atol=1e-5)
        assert torch.allclose(layer.mlp.split(x, s).sum(0), layer.mlp.dense(x), atol=1e-5)
        w = torch.randn(8, 5, generator=g)  # row 0 of eye picks w's first row: only chunk 0 holds it
        assert torch.equal(split_k(torch.eye(8)[:2], w, s)[0, 0], w[0])
        assert torch.equal(split_k(torch.eye(8)[:2], w, s)[1:, 0], torch.zeros(s - 1, 5))
    if s != 4:
        return  # the compiled runners once (~10 s of CI): the products above hold for every count
    prompt = [ids for ids, _ in workload()[:1]][0]
    traced: dict[int, list[str]] = {0: [], s: []}

    def runner_for(split: int) -> StaticRunner:  # a backend that keeps the code dynamo traced, then runs it
        def keep(gm, example_inputs):
            traced[split].append(gm.code)
            return gm.forward

        return StaticRunner(
            target, drafter, STEPS, use_graphs=False, compile=True, compile_backend=keep, proj_split=split
        )

    want = Decoder(target, drafter, STEPS, runner_for(0)).generate(prompt, TOKENS)
    runner = runner_for(s)
    got = Decoder(target, drafter, STEPS, runner).generate(prompt, TOKENS)
    # the split path ran: its graphs hold two more batched GEMMs a layer (o and down) than the dense ones
    bmms = {k: sum(code.count("torch.bmm") for code in v) for k, v in traced.items()}
    layers_ = len(target.model.layers)
    more = bmms[s] - bmms[0]
    assert more > 0 and more % (2 * layers_) == 0, bmms  # 2 a layer in each traced shape of the target
    assert runner.proj_split == s
    same = sum(p == q for p, q in zip(want.output_ids, got.output_ids)) / len(want.output_ids)
    assert got.output_ids[:20] == want.output_ids[:20] and same > 0.9, f"agreement {same:.2f}"
    assert StaticRunner(target, None, 0, use_graphs=False, proj_split=s).proj_split == 0  # compiled only
    with pytest.raises(ValueError, match=r"proj_split=7: o_proj's and down_proj's inputs \(\d+, \d+ per row\) must"):
        StaticRunner(target, None, 0, use_graphs=False, compile=True, compile_backend="aot_eager", proj_split=7)


def test_inductor_folds_the_partials_sum_into_the_norm_kernel():
    """The premise of ``split``: inductor generates no kernel of its own for the partials' sum; it is read
    inside the residual add + RMSNorm kernel that the dense path has too (one fused kernel either way; the
    GEMMs are extern calls). Real inductor, on CPU (its scheduler decides fusion for CUDA alike)."""
    import re

    from torch._inductor.utils import run_and_get_code

    target, _ = tiny_models(threads=1)
    t = 2  # at one row CPU inductor makes the GEMM itself a fused loop; from two on it stays an extern GEMM, as on CUDA
    layer, a, x, _ = layer_inputs(target, 0, seed=2, t=t)
    norm = layer.post_attention_layernorm

    def dense(x, a):
        y = x + layer.self_attn.out_dense(a).view(1, t, -1)
        return y, norm.static(y, True)

    def split(x, a):
        y = x + layer.self_attn.out_split(a, 4).sum(0).to(x.dtype).view(1, t, -1)
        return y, norm.static(y, True)

    kernels, codes = {}, {}
    with torch.no_grad():
        for name, fn in (("dense", dense), ("split", split)):
            out, code = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), x, a)
            codes[name] = "\n".join(code)
            kernels[name] = sorted(set(re.findall(r"cpp_fused_\w+", codes[name])))
            assert torch.allclose(out[1], dense(x, a)[1], atol=1e-4)
    assert "extern_kernels.bmm" in codes["split"]  # the partials' GEMM: a library call, as cuBLAS's on CUDA
    assert len(kernels["split"]) == len(kernels["dense"]), kernels  # and no kernel of its own for their sum
    assert any("sum" in k and "rsqrt" in k for k in kernels["split"]), kernels  # read inside the norm's kernel


def test_the_ranks_static_runner_takes_the_servers_compile_and_split_flags():
    """``--enable-torch-compile --proj-split N`` reach the rank's StaticRunner (scheduler.static_runner, what
    run_rank builds), and the dynamic path builds none. The compile itself runs at the warm-up (not here)."""
    from spec_decode.engines.embedded.scheduler import RankSpec, static_runner

    from ..conftest import DRAFTER, TARGET

    target, drafter = tiny_models(threads=1)

    def spec(**flags):
        return RankSpec(
            model_path=str(TARGET), draft_model_path=str(DRAFTER), steps=STEPS, tp_size=1, device="cpu",
            cpu_threads=1, random_seed=0, decode_log_interval=40, log_level="warning", dist_port=0, front_pid=0,
            **flags,
        )  # fmt: skip

    cpu = torch.device("cpu")
    runner = static_runner(spec(static_path=True, torch_compile=True, proj_split=4), target, drafter, cpu)
    assert (runner.compile, runner.proj_split, runner.k) == (True, 4, STEPS)
    assert static_runner(spec(static_path=True), target, drafter, cpu).proj_split == 0
    assert static_runner(spec(), target, drafter, cpu) is None  # CPU's dynamic path
