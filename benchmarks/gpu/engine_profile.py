"""Where a decoded token's time goes in the embedded engine's CUDA path (one GPU), per variant of the
static path (``old``: graph_ops off; ``ops``: model.py's prepare_graph_ops with SDPA; ``ops-bmm``: the
same with baddbmm/softmax/bmm attention):

    timeout 300 python benchmarks/gpu/engine_profile.py [--variants old,ops,ops-bmm] [--attention-micro] [--compile]

Prints, per variant and per captured shape (steps 3: decode, verify, draft, extend1..4):
- ``gpu_us``: GPU time per replay, CUDA events around 200 back-to-back replays (median of 5 sets);
- ``host_us``: host time to enqueue one replay (the same loop on the host clock, before the sync);
- ``kernels``: kernels per replay (torch.profiler over 5 replays, CUDA kernel events / 5);
- ``eager_us``: the same function run eagerly (``--disable-cuda-graph``), wall per call after a sync;
then the decode graph's kernels by total time, and ``Decoder.generate`` wall per token (500 tokens,
median of 5): graphs with no ``on_step``, through the rank's Scheduler (on_step + counters), eager,
and steps 1, 2, 3, 5. ``--attention-micro`` times attention variants (SDPA backends, bmm, bmm with
P @ V split, elementwise, per query) for one step's 6 layers at T = 1, 2, 4, 6; ``--compile`` adds torch.compile (inductor) of the old decode function captured
in a graph: compile seconds and GPU us per replay (an upper bound on what fusion could give).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.scheduler import Scheduler
from spec_decode.engines.embedded.tokenizer import encode

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "old": dict(graph_ops=False),
    "ops": dict(graph_ops=True, attention="sdpa"),
    "ops-bmm": dict(graph_ops=True, attention="bmm"),
}
REPLAYS = 200  # per timed set: long enough that event overhead (a few us) is < 1%


def models():
    target = load_target(ROOT / "models/tiny/target", "cuda")
    return target, load_drafter(ROOT / "models/tiny/drafter", target, "cuda")


def gpu_us(fn, sets: int = 5) -> tuple[float, float]:
    """(GPU us per call by events, host us per call) over REPLAYS back-to-back calls."""
    gpu, host = [], []
    for _ in range(sets):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(REPLAYS):
            fn()
        host.append((time.perf_counter() - t0) / REPLAYS * 1e6)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / REPLAYS * 1e3)
    return statistics.median(gpu), statistics.median(host)


def capture(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """``calls`` calls of ``fn`` in one CUDA graph, after one warm call on the capture's side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g


def eager_us(fn, n: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def kernels(fn, n: int = 5) -> tuple[float, list[tuple[str, int, float]]]:
    """Kernels per call and, by total time, (name, count per call, us per call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    count, total = Counter(), defaultdict(float)
    for e in prof.events():
        if (
            e.device_type == torch.autograd.DeviceType.CUDA
            and "memcpy" not in e.name.lower()
            and "memset" not in e.name.lower()
        ):
            count[e.name] += 1
            total[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    top = sorted(((k[:120], count[k] / n, total[k] / n) for k in count), key=lambda r: -r[2])
    return sum(count.values()) / n, top


GEMM_MARKS = ("gemm", "nvjet", "cutlass", "splitkreduce", "sm90_xmma", "sm80_xmma")


def split_gemm(by_time: list[tuple[str, float, float]]) -> dict:
    """Kernels by time (``kernels``' list) summed into GEMMs (cuBLAS's, split-K reduces included) and the
    rest: kernels per call and us per call of each."""
    gemm = [r for r in by_time if any(m in r[0].lower() for m in GEMM_MARKS)]
    rest = [r for r in by_time if r not in gemm]
    return {
        "gemm_kernels": sum(c for _, c, _ in gemm),
        "gemm_us": round(sum(t for _, _, t in gemm), 1),
        "other_kernels": sum(c for _, c, _ in rest),
        "other_us": round(sum(t for _, _, t in rest), 1),
    }


def attention_micro() -> dict:
    """One layer's attention over the static cache (8 heads of 24, 1024 slots, additive mask), per
    variant and T, as GPU us per call: 6 calls captured in one graph (a decode step's 6 layers)."""
    h, hd, slots = 8, 24, 1024
    keys, values = torch.randn(h, slots, hd, device="cuda"), torch.randn(h, slots, hd, device="cuda")
    scale = hd**-0.5

    def bmm(q, mask):
        return torch.bmm(torch.softmax(torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=scale), -1), values)

    def bmm_contig(q, mask):
        return bmm(q.contiguous(), mask)

    def elementwise(q, mask):
        p = torch.softmax((q[:, :, None] * keys[:, None]).sum(-1) * scale + mask, -1)
        return (p[..., None] * values[:, None]).sum(-2)

    def bmm_split(q, mask, split=8):  # P @ V as split * heads products over slots / split, then a sum
        p = torch.softmax(torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=scale), -1)
        t, chunk = q.shape[1], slots // split
        pp = p.view(h, t, split, chunk).transpose(1, 2).reshape(h * split, t, chunk)
        return torch.bmm(pp, values.view(h * split, chunk, hd)).view(h, split, t, hd).sum(1)

    def per_query(q, mask):
        return torch.cat([bmm(q[:, i : i + 1], mask[i : i + 1]) for i in range(q.shape[1])], dim=1)

    def sdpa(backend):
        from torch.nn.attention import sdpa_kernel

        def run(q, mask):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q[None], keys[None], values[None], attn_mask=mask
                )[0]

        return run

    from torch.nn.attention import SDPBackend

    variants = {
        "bmm": bmm,
        "bmm_split": bmm_split,
        "bmm_contig": bmm_contig,
        "elementwise": elementwise,
        "per_query": per_query,
        "sdpa_math": sdpa(SDPBackend.MATH),
        "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
    }
    res = {}
    print("\n| attention (6 calls = one step) us | " + " | ".join(f"T={t}" for t in (1, 2, 4, 6)) + " |")
    print("|---" * 5 + "|")
    for name, fn in variants.items():
        row = []
        for t in (1, 2, 4, 6):
            y = torch.randn(h, t, 3 * hd, device="cuda")
            q = y[:, :, :hd]  # strided, as the engine's q views are
            pos = torch.arange(500, 500 + t, device="cuda")
            mask = torch.zeros(t, slots, device="cuda").masked_fill(
                torch.arange(slots, device="cuda")[None] > pos[:, None], float("-inf")
            )
            try:
                ref = bmm(q.contiguous(), mask)
                err = float((fn(q, mask) - ref).abs().max())
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        fn(q, mask)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    for _ in range(6):
                        fn(q, mask)
                us, _ = gpu_us(g.replay)
                row.append(f"{us:.1f} (err {err:.0e})")
                res[f"{name} T={t}"] = us
            except Exception as e:  # a backend that refuses these shapes: say so, go on
                row.append(f"failed: {type(e).__name__}")
        print(f"| {name} | " + " | ".join(row) + " |")
    return res


def generate_us(dec: Decoder, ids, tokens: int = 500, sched: Scheduler | None = None, reps: int = 5) -> float:
    run = (lambda: sched.generate(ids, tokens)) if sched else (lambda: dec.generate(ids, tokens))
    run()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / tokens * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="old,ops,ops-bmm")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--attention-micro",
        action="store_true",
        help="time attention variants over the static cache at T = 1, 2, 4, 6 queries",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    ids = encode(json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, replays per set {REPLAYS}")
    out = {}
    for name in filter(None, args.variants.split(",")):
        kw = VARIANTS[name]
        target, drafter = models()
        rows = {}
        print(f"\n## variant {name} {kw}\n| shape | gpu_us | host_us | kernels | eager_us |\n|---|---|---|---|---|")
        for d in (None, drafter):  # decode@1 (the baseline's), then verify@1, draft@1, extend@1 (steps 3)
            k = 3 if d is not None else 0
            graph = StaticRunner(target, d, k, use_graphs=True, **kw)
            eager = StaticRunner(target, d, k, use_graphs=False, **kw)
            for runner in (graph, eager):  # one request's prompt in slot 0 (the shapes' rows point at it)
                runner.prefill(runner.alloc(), torch.tensor([ids], device="cuda"))
                for bufs in runner.bufs.values():
                    bufs["slots"].fill_(0)
            for shape, g in graph.graphs.items():
                g_us, h_us = gpu_us(g.replay)
                try:
                    n, top = kernels(g.replay)
                except Exception as err:  # the profiler is a tool here, not the measurement: go on
                    print(f"profiler failed on {shape}: {err!r}")
                    n, top = float("nan"), []
                e_us = eager_us(eager.fns[shape])
                rows[shape] = {"gpu_us": g_us, "host_us": h_us, "kernels": n, "eager_us": e_us, "top": top}
                print(f"| {shape} | {g_us:.1f} | {h_us:.1f} | {n:.0f} | {e_us:.0f} |")
            del graph, eager
        for shape, lines in (("decode@1", 18), ("verify@1", 12)):
            print(f"\n{shape} graph kernels by time (us per replay | count per replay | name):")
            for k, c, us in rows[shape]["top"][:lines]:
                print(f"  {us:7.1f} us  x{c:4.0f}  {k}")
        base_g = Decoder(target, None, 0, StaticRunner(target, None, 0, use_graphs=True, **kw))
        base_e = Decoder(target, None, 0, StaticRunner(target, None, 0, use_graphs=False, **kw))
        gen = {
            "baseline graph, no on_step": generate_us(base_g, ids),
            "baseline graph, Scheduler (on_step)": generate_us(base_g, ids, sched=Scheduler(base_g, 0, 10**9)),
            "baseline graph, Scheduler, decode log every 40": generate_us(base_g, ids, sched=Scheduler(base_g, 0, 40)),
            "baseline eager": generate_us(base_e, ids, reps=2),
        }
        for k in (1, 2, 3, 5):
            dec = Decoder(target, drafter, k, StaticRunner(target, drafter, k, use_graphs=True, **kw))
            gen[f"steps={k} graph, Scheduler"] = generate_us(dec, ids, sched=Scheduler(dec, 0, 10**9))
        same = base_g.generate(ids, 300).output_ids == base_e.generate(ids, 300).output_ids
        print("\n| generate (500 tokens, median of 5) | us/token | tok/s |\n|---|---|---|")
        for k, us in gen.items():
            print(f"| {k} | {us:.0f} | {1e6 / us:.0f} |")
        print(f"baseline graph == eager (300 tokens): {same}")
        out[name] = {"shapes": rows, "generate_us": gen, "graph_equals_eager": same}
        del base_g, base_e
        torch.cuda.empty_cache()
    if args.attention_micro:
        out["attention_micro"] = attention_micro()
    if args.compile:
        target, _ = models()
        runner = StaticRunner(target, None, 0, use_graphs=False, graph_ops=False)
        fn = torch.compile(runner.fns["decode@1"], fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn()
        torch.cuda.synchronize()
        g_us, h_us = gpu_us(g.replay)
        try:
            n, top = kernels(g.replay)
        except Exception as err:
            print(f"profiler failed: {err!r}")
            n, top = float("nan"), []
        print(
            f"\ntorch.compile (inductor) of the old decode fn: compile {compile_s:.1f} s, graph replay "
            f"{g_us:.1f} us GPU, {h_us:.1f} us host, {n:.0f} kernels"
        )
        for k, c, us in top[:10]:
            print(f"  {us:7.1f} us  x{c:4.0f}  {k}")
        out["compile"] = {"compile_s": compile_s, "gpu_us": g_us, "host_us": h_us, "kernels": n}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
