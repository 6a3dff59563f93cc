"""The projections as the engine's Triton GEMV (gemv.py; marker `gpu`, never in CI):

    timeout 600 python -m pytest -p no:xdist -m gpu -s tests/gpu/test_gemv.py

- the kernels against torch's matmul in the engine's two layouts (per-unit matrices side by side, and
  one (K, N) matrix), at 1, 4 and 16 rows, with the config the engine takes and with others of
  real_shape.py's sweep (split K 1 to 16, block_n 64 to 256): within bf16 rounding; more than 16 rows,
  or a block that does not divide a unit, refused naming the shapes;
- the same sums in every call (a fixed order: bit-identical outputs across calls and in a CUDA graph);
- a small bf16 synthetic pair on the compiled static path with ``gemv="triton"``: graph replays equal
  the same compiled shapes run eagerly token for token; the logits of a teacher-forced sequence agree
  with the cuBLAS path's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from spec_decode.engines.embedded import gemv  # noqa: E402
from spec_decode.engines.embedded.decoding import Decoder  # noqa: E402
from spec_decode.engines.embedded.graphs import StaticRunner  # noqa: E402
from spec_decode.engines.embedded.model import load_drafter, load_target  # noqa: E402

DEV = "cuda"
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0
OTHERS = [(128, 128, 1, 3, 4), (128, 128, 16, 3, 4), (128, 64, 8, 3, 4), (128, 256, 4, 3, 8), (64, 128, 8, 4, 4)]


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("t", [1, 4, 16])
@pytest.mark.parametrize("layout", ["units", "dense"])
def test_gemv_matches_matmul(layout, t):
    g = torch.Generator(device=DEV).manual_seed(t)
    k = 1024
    x = torch.randn(t, k, device=DEV, dtype=torch.bfloat16, generator=g)
    if layout == "units":  # (n, K, c): q/k/v and gate/up
        w = torch.randn(4, k, 768, device=DEV, dtype=torch.bfloat16, generator=g) / k**0.5
        want = torch.matmul(x[None], w).transpose(0, 1).reshape(t, -1)
        c, n = 768, 4 * 768
    else:  # (K, N): o and down over the units stacked
        w = torch.randn(k, 2048, device=DEV, dtype=torch.bfloat16, generator=g) / k**0.5
        want, c, n = x @ w, 2048, 2048
    for cfg in [gemv.config_for(k, n, c, SMS), *OTHERS]:
        got = gemv.gemv(x, w, cfg)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        assert rel(got, want) < 1e-2, f"{layout} T={t} config {cfg}: relative error {rel(got, want):.2e}"
    assert torch.equal(gemv.project(x, w), gemv.gemv(x, w))  # the operator is the same call


def test_refusals_name_the_shapes():
    x = torch.randn(17, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(256, 256, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"T <= 16"):
        gemv.gemv(x, w)
    with pytest.raises(ValueError, match=r"c % block_n"):
        gemv.gemv(x[:2], torch.randn(2, 256, 96, device=DEV, dtype=torch.bfloat16), (128, 128, 2, 3, 4))


def test_the_same_sums_every_call_and_in_a_graph():
    x = torch.randn(4, 4096, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(8, 4096, 768, device=DEV, dtype=torch.bfloat16) / 64
    first = gemv.gemv(x, w)
    assert gemv.config_for(4096, 8 * 768, 768, SMS)[2] > 1  # split K: the fixed-order sum is exercised
    assert all(torch.equal(gemv.gemv(x, w), first) for _ in range(5))
    graph, out = torch.cuda.CUDAGraph(), None
    gemv.gemv(x, w)  # compiled and warm before capture
    with torch.cuda.graph(graph):
        out = gemv.gemv(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, gemv.gemv(x, w))


def test_compiled_triton_gemv_path_replays_like_its_eager_run_and_agrees_with_cublas(bf16_pair):
    tdir, ddir = bf16_pair
    target = load_target(tdir, DEV)
    drafter = load_drafter(ddir, target, DEV)
    ids = list(b"def fibonacci(n):\n    return")
    for steps, d in ((0, None), (3, drafter)):
        graph = StaticRunner(target, d, steps, use_graphs=True, compile=True, gemv="triton")
        eager = StaticRunner(target, d, steps, use_graphs=False, compile=True, gemv="triton")
        assert graph.graphs and graph.capture_error is None and graph.gemv == "triton"
        g = Decoder(target, d, steps, graph).generate(ids, 200)
        e = Decoder(target, d, steps, eager).generate(ids, 200)
        assert g.output_ids == e.output_ids, f"steps={steps}: compiled graph replay differs from compiled eager"
        assert (g.verify_ct, g.correct_drafts) == (e.verify_ct, e.correct_drafts)
    # teacher-forced logits on the dense tp-1 path, one position at a time: Triton against cuBLAS
    seq = torch.tensor(list(b"def fibonacci(n):\n    # return the n-th Fibonacci number\n" * 4), device=DEV)
    logits = {}
    for tri in (False, True):
        cache = target.new_static_cache(2)
        cache.prepare_graph_ops("slots")
        slot, out = torch.tensor([0], device=DEV), []
        with torch.no_grad():
            for i in range(len(seq)):
                lg, _ = target.forward_static(
                    seq[i : i + 1][None], torch.tensor([i], device=DEV), cache.rows(slot, 1), rot_rows=False,
                    dense=True, gemv=tri,
                )  # fmt: skip
                out.append(lg[0].float())
        logits[tri] = torch.stack(out)
    a, b = logits[False], logits[True]
    err = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
    same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(
        f"\ntriton gemv vs cublas, {len(seq)} teacher-forced positions: max relative logit error {err:.4f}, argmax {same:.3f}"
    )
    assert err < 0.02 and same > 0.95
