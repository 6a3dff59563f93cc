"""Cycle length of the embedded engine on a real-shaped synthetic target (issue 31), against a roofline.

    timeout 560 python benchmarks/gpu/real_shape.py --out $OUT/real_shape                 # H200: 8B shape, tp 1
    timeout 300 python benchmarks/gpu/real_shape.py --device cpu --model synthetic_tiny \\
        --drafter synthetic_tiny_eagle3 --out /tmp/real_shape                             # the same code on CPU

Generates the pair if missing (``python -m spec_decode build synthetic``: seeded random weights, conf's
``synthetic`` section), loads it on one device as a rank does (tp 1; on CUDA the static path with CUDA
graphs), and decodes with forced acceptance (spec.simulate_accept_len's engine side: ForcedAcceptance,
token mode ``--token-mode``) at each ``--steps`` x ``--accept-lens``, plus the plain baseline.

Per cell: ``cycle_ms`` = (wall of a long generation - wall of a short one) / (their verify-count
difference), so the prompt's prefill cancels; median and 95% t-interval over ``--repeats``; tok/s of
the long generation. The estimate (``roofline_ms``) is one decode step read from HBM once:
(target weights read per forward: all but the embedding, + the static KV cache that our CUDA path
reads whole at every step) / bandwidth, plus ``steps`` drafter forwards (k-1 drafts + 1 re-extend),
each (drafter weights + its KV cache) / bandwidth. Bandwidth: ``--bandwidth-tbs``, by default 4.3 TB/s on an
H200 (its achievable HBM3e read rate, below its 4.8 TB/s peak) and on any other card ``measured``: that
card's lm_head GEMV in a CUDA graph, ``read_rate_tbs`` (2.90-2.93 TB/s on the lent H100), so a card is
never judged against another card's figure. Compute, kernel launches and the host are not in
it: ``ratio`` = measured / estimate says how far from weight-bound the engine is (must show: <= 1.25).

Writes ``real_shape.json`` (every number) and ``real_shape.md`` (the table) under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from spec_decode.analysis.stats import summarize
from spec_decode.engines.embedded import synthetic
from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.kvcache import slot_rows
from spec_decode.engines.embedded.layers import split_k
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.parallel import tree_sum

ROOT = Path(__file__).resolve().parents[2]
PROMPT = b"def fibonacci(n):\n    # return the n-th Fibonacci number\n"
MUST_SHOW_RATIO = 1.25
H200_READ_TBS = 4.3  # the roofline's constant on an H200 (its lm_head kernel read at 4.29-4.42 TB/s there)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def drop_training_copies(target) -> None:
    """At tp 1 the target keeps its full projections beside the per-unit copies that serve (for the
    drafter build's forward_train): drop them, so memory is the serving layout's."""
    for layer in target.model.layers:
        a, m = layer.self_attn, layer.mlp
        a.q_proj = a.k_proj = a.v_proj = a.o_proj = None
        m.gate_proj = m.up_proj = m.down_proj = None


def load_pair(model: str, drafter: str, device: str):
    """The synthetic pair of conf's ``model`` and ``drafter`` entries on ``device``, in the serving layout."""
    target = load_target(ROOT / synthetic.read_conf("model", model)["path"], device)
    draft = load_drafter(ROOT / synthetic.read_conf("drafter", drafter)["path"], target, device)
    drop_training_copies(target)
    return target, draft


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def target_bytes(target) -> int:
    """Weights one target forward reads in the serving layout: per-unit q/k/v, o, gate/up, down, the
    norms and the lm_head (an embedding lookup reads rows only: not counted)."""
    total = nbytes(target.lm_head.weight, target.model.norm.weight)
    for layer in target.model.layers:
        a, m = layer.self_attn, layer.mlp
        total += nbytes(
            a.u_qkv, a.u_o, m.u_gate_up, m.u_down, layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        )
    return total


def drafter_bytes(drafter) -> int:
    """Weights one drafter forward reads: all of its own (fc, the layer, norm, lm_head; the shared
    embedding reads rows only)."""
    return sum(nbytes(t) for name, t in drafter.state_dict().items() if name not in ("d2t", "t2d"))


def kv_bytes(model, layers: int, positions: float) -> int:
    """The K/V of ``positions`` tokens that one forward of the model must read (the context's)."""
    s = model.shape
    return int(2 * layers * s.num_key_value_heads * positions * s.head_dim * model.lm_head.weight.element_size())


def context(args) -> float:
    """The mean position of the timed tokens: a cycle is timed as the long generation minus the short
    one, so over the positions from the short one's end to the long one's."""
    return len(PROMPT) + (args.short + args.tokens) / 2


def roofline(target, drafter, steps: int, bandwidth_tbs: float, positions: float) -> dict:
    """Weights read once per forward plus the context's K/V, at ``bandwidth_tbs``. (Until 2026-12-02 the
    K/V term was the whole static cache, max_len positions, which the masked attention paths read every
    step: 0.268 GB more on the 8B shape, a 1.8% more lenient roofline.)"""
    bw = bandwidth_tbs * 1e12
    t_w, t_kv = target_bytes(target), kv_bytes(target, target.shape.num_hidden_layers, positions)
    d_w, d_kv = (drafter_bytes(drafter), kv_bytes(drafter, 1, positions)) if drafter is not None else (0, 0)
    target_ms, drafter_ms = (t_w + t_kv) / bw * 1e3, (d_w + d_kv) / bw * 1e3
    return {
        "target_weight_bytes": t_w,
        "target_kv_bytes": t_kv,
        "drafter_weight_bytes": d_w,
        "drafter_kv_bytes": d_kv,
        "bandwidth_tbs": bandwidth_tbs,
        "context_positions": positions,
        "target_forward_ms": round(target_ms, 4),
        "drafter_forward_ms": round(drafter_ms, 4),
        "roofline_ms": round(target_ms + steps * drafter_ms, 4),
    }


def read_rate_tbs(target, device: str, repeats: int = 15, per_replay: int = 10) -> dict:
    """The read rate a weight-bound GEMV reaches on this card: the target's own lm_head (the largest
    matrix of a decode step, ~1 GB on the 8B shape) times one row, ``per_replay`` GEMVs back to back in
    one CUDA graph (as in the decode graph: no launch gap between them), timed by engine_profile's
    ``capture`` and ``gpu_us``. ``--bandwidth-tbs measured`` puts it in the roofline instead of a constant.
    (A first version timed single eager launches: 418 us on the H100, where the decode graph's own lm_head
    kernel took 352 us, a rate 16% too low and a roofline too lenient.) On a CPU: median of ``repeats``
    host-timed rounds of ``per_replay`` GEMVs."""
    w = target.lm_head.weight
    x = torch.randn(1, w.shape[1], device=w.device, dtype=w.dtype)
    gemv = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    if device.startswith("cuda"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from engine_profile import capture, gpu_us  # benchmarks/gpu is scripts: by path

        ms = gpu_us(capture(gemv, calls=per_replay).replay)[0] / per_replay / 1e3
    else:
        times = []
        for i in range(3 + repeats):
            t0 = time.perf_counter()
            for _ in range(per_replay):
                gemv()
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3 / per_replay)
        ms = statistics.median(times)
    tbs = nbytes(w) / (ms * 1e-3) / 1e12
    if not (math.isfinite(tbs) and tbs > 0):
        raise RuntimeError(f"read_rate_tbs: the lm_head GEMV timed at {ms} ms: no read rate for the roofline")
    return {"bytes": nbytes(w), "median_us": round(ms * 1e3, 2), "tbs": float(f"{tbs:.4g}")}


def timed(decoder: Decoder, ids: list[int], n: int, device: str, forced: ForcedAcceptance | None, overlap: bool):
    if forced is not None:
        forced.generator.manual_seed(0)
    sync(device)
    t0 = time.perf_counter()
    gen = decoder.generate(ids, n, overlap=overlap)
    sync(device)
    return time.perf_counter() - t0, gen


def measure(target, drafter, steps: int, accept_len: float | None, args, runner) -> dict[str, dict]:
    """Per overlap mode (``--overlap``, interleaved within each repeat): the cycle (long generation minus
    the short one, over their step difference) and tok/s."""
    forced = ForcedAcceptance(accept_len, steps, token_mode=args.token_mode, seed=0) if drafter is not None else None
    decoder = Decoder(target, drafter, steps, runner, forced)
    ids = list(PROMPT)
    modes = args.overlap.split(",")
    timed(decoder, ids, args.short, args.device, forced, False)  # warm (lazy inits, allocator)
    cycles, tok_s, last = {m: [] for m in modes}, {m: [] for m in modes}, {}
    for _ in range(args.repeats):
        for mode in modes:
            on = mode == "on"
            w_short, g_short = timed(decoder, ids, args.short, args.device, forced, on)
            w_long, g_long = timed(decoder, ids, args.tokens, args.device, forced, on)
            if drafter is None:
                n_short, n_long = g_short.decode_steps, g_long.decode_steps
            else:
                n_short, n_long = g_short.verify_ct, g_long.verify_ct
            cycles[mode].append((w_long - w_short) / (n_long - n_short) * 1e3)
            tok_s[mode].append(len(g_long.output_ids) / w_long)
            last[mode] = g_long
    out = {}
    for mode in modes:
        cyc, tps, g_long = summarize(cycles[mode]), summarize(tok_s[mode]), last[mode]
        accept = len(g_long.output_ids) / g_long.verify_ct if drafter is not None else 1.0
        out[mode] = {
            "steps": steps,
            "overlap": mode == "on",
            "accept_len_forced": accept_len,
            "accept_len_measured": round(accept, 3),
            "cycle_ms": round(cyc.median, 4),
            "cycle_ms_ci95": [round(cyc.ci95_lo, 4), round(cyc.ci95_hi, 4)],
            "cycle_ms_runs": [round(c, 4) for c in cycles[mode]],
            "tok_s": round(tps.median, 1),
            "tok_s_ci95": [round(tps.ci95_lo, 1), round(tps.ci95_hi, 1)],
            "cuda_graph": decoder.cuda_graph,
        }
    return out


def set_pdl(on: bool) -> None:
    """Inductor's PDL switch for the runners built after this call (its FX graph cache keys on the config)."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "enable_pdl"):
        if on:
            raise SystemExit(f"--pdl on: torch {torch.__version__}'s inductor has no triton.enable_pdl")
        return
    inductor_config.triton.enable_pdl = on


def runner_for(
    target,
    drafter,
    steps: int,
    device: str,
    attention: str = "auto",
    compile: bool = False,
    pin_puts: bool = False,
    proj_split: int = 0,
):
    if not device.startswith("cuda"):
        return None  # the CPU rank decodes eagerly (scheduler.run_rank does the same)
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.monotonic()
    runner = StaticRunner(
        target,
        drafter,
        steps,
        use_graphs=True,
        attention=None if attention == "auto" else attention,
        compile=compile,
        proj_split=proj_split,
    )
    print(
        f"  runner (steps {steps}, compile {compile}, attention {runner.attention}, proj split {runner.proj_split}): "
        f"{time.monotonic() - t0:.1f} s to build and capture",
        flush=True,
    )
    if runner.capture_error:
        print(f"  capture failed, eager: {runner.capture_error}", flush=True)
    runner.pin_puts = pin_puts
    return runner


def graph_kernels(runner, top: int = 14) -> dict:
    """The baseline's decode graph (decode@1): GPU us per replay (CUDA events over back-to-back replays),
    kernels per replay and the kernels by total time (torch.profiler), as engine_profile.py measures."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_profile import capture, gpu_us, kernels, split_gemm  # benchmarks/gpu is scripts: by path

    graph = runner.graphs["decode@1"]
    us, host = gpu_us(graph.replay)
    count, by_time = kernels(graph.replay)
    return {
        "decode_gpu_us": round(us, 1),
        "host_us": round(host, 1),
        "kernels": count,
        "top": [[name, c, round(t, 1)] for name, c, t in by_time[:top]],
        "all": [[name, c, round(t, 2)] for name, c, t in by_time],  # every kernel: what a fusion would remove
        **split_gemm(by_time),
        "slot_gather_us": gather_micro(runner, gpu_us, capture),
        "loop_gaps": [loop_gaps(runner.target, runner, overlap=o) for o in (False, True)],
    }


def cycle_kernels(runner, drafter, steps: int, accept_len: float, token_mode: str) -> dict:
    """A speculative cycle's parts (batch 1): GPU us per replay of the verify, draft and re-extend graphs
    (a cycle replays each once: the draft graph holds the whole chain of steps - 1 drafter forwards, and
    steps 1 has none), the verify graph's kernels by time, and the loop's GPU idle per cycle (loop_gaps)
    at this forced accept length, overlap on."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_profile import gpu_us, kernels, split_gemm  # benchmarks/gpu is scripts: by path

    out = {
        f"{n}_gpu_us": round(gpu_us(runner.graphs[f"{n}@1"].replay)[0], 1) if f"{n}@1" in runner.graphs else 0.0
        for n in ("verify", "draft", "extend")
    }
    count, by_time = kernels(runner.graphs["verify@1"].replay)
    out["verify_kernels"] = count
    out["verify_top"] = [[name, c, round(t, 1)] for name, c, t in by_time[:12]]
    out["verify_all"] = [[name, c, round(t, 2)] for name, c, t in by_time]
    out["verify_split"] = split_gemm(by_time)
    out["graphs_us_per_cycle"] = round(out["verify_gpu_us"] + out["draft_gpu_us"] + out["extend_gpu_us"], 1)
    forced = ForcedAcceptance(accept_len, steps, token_mode=token_mode, seed=0)
    out["loop"] = loop_gaps(runner.target, runner, drafter=drafter, steps=steps, forced=forced)
    return out


def loop_gaps(
    target, runner, tokens: int = 64, overlap: bool = True, top: int = 8, drafter=None, steps: int = 0, forced=None
) -> dict:
    """Where the GPU idles in the decode loop itself (``Decoder.generate``; the baseline, or with a drafter
    the speculative cycle): torch.profiler's CUDA activity over one generation, merged into busy
    intervals. Per step (cycle): the wall, the GPU busy time and the idle time between the first and the
    last kernel; the longest gaps with the kernels around them (a gap after the step's last kernel and
    before the next graph's first is host time the loop did not hide)."""
    from torch.profiler import ProfilerActivity, profile

    decoder = Decoder(target, drafter, steps, runner, forced)
    ids = list(PROMPT)
    decoder.generate(ids, 8, overlap=overlap)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        gen = decoder.generate(ids, tokens, overlap=overlap)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, gaps, end, prev = 0.0, [], None, None
    for start, stop, name in spans:
        if end is not None and start > end:
            gaps.append((start - end, prev, name))
        if end is None or start > end:
            busy += stop - start
        elif stop > end:
            busy += stop - end
        end, prev = (stop, name) if end is None or stop > end else (end, prev)
    n = gen.decode_steps
    idle = sum(g for g, _, _ in gaps)
    return {
        "overlap": overlap,
        "steps": n,
        "wall_us_per_step": round(wall * 1e6 / n, 1),
        "gpu_busy_us_per_step": round(busy / n, 1),
        "gpu_idle_us_per_step": round(idle / n, 1),
        "top_gaps": [[round(g, 1), a[:60], b[:60]] for g, a, b in sorted(gaps, reverse=True)[:top]],
    }


def gather_micro(runner, gpu_us, capture) -> dict:
    """One layer's K slot gathered for one row, torch's index_select against kvcache.slot_rows (8-byte
    words), as GPU us per call: 32 calls captured in one graph (a decode step's layers), interleaved sets."""
    kl, ids = runner.tcache.k[0], runner.bufs["decode@1"]["slots"]
    assert torch.equal(slot_rows(kl, ids), kl.index_select(0, ids))
    out = {}
    for name, fn in (("index_select", lambda: kl.index_select(0, ids)), ("slot_rows", lambda: slot_rows(kl, ids))):
        out[name] = round(gpu_us(capture(fn, 32).replay)[0] / 32, 2)
    return out


# (block_k, block_n, split_k, stages, warps) configs of gemv.py's GEMV that --gemm-micro tries per shape
GEMV_SWEEP = [
    *[(128, 128, s, 3, 4) for s in (1, 2, 4, 8, 16)],
    (64, 128, 8, 4, 4),
    (128, 64, 8, 3, 4),
    (128, 64, 16, 3, 4),
    (256, 128, 4, 3, 8),
    (128, 256, 2, 3, 8),
    (128, 256, 4, 3, 8),
]


def gemm_micro(target, tokens: tuple[int, ...] = (1, 4)) -> list[dict]:
    """Each projection of a decode step in the layouts it could run in, as GPU us per layer and TB/s of
    its weight: 32 calls (one per layer, each its own weight, so none is served from L2) captured in
    one graph. ``unit``: the engine's per-unit batched matmul (o/down: partials + the tree sum);
    ``dense``: one matmul over the units side by side, x @ W (in, out) (o/down: a view of the same
    weight, the units' sum inside the GEMM); ``linear``: F.linear with (out, in) rows (HF's layout);
    ``triton``: gemv.py's split-K GEMV on the engine's own weights, the best of GEMV_SWEEP;
    ``triton-engine``: the config gemv.config_for would give an engine."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_profile import capture, gpu_us
    from gemv import config_for, gemv  # benchmarks/gpu is scripts, not a package: by path

    layers = target.model.layers
    h = target.shape.hidden_size
    rows = []

    def graphed(fn):
        return gpu_us(capture(fn).replay)[0] / len(layers)

    for proj in ("qkv", "o", "gate_up", "down"):
        units = [
            {"qkv": lyr.self_attn.u_qkv, "o": lyr.self_attn.u_o, "gate_up": lyr.mlp.u_gate_up, "down": lyr.mlp.u_down}[
                proj
            ]
            for lyr in layers
        ]
        n, cin, cout = units[0].shape
        row_parallel = proj in ("o", "down")
        if row_parallel:  # (n, c_in, out): the units stacked along the input
            dense = [u.view(n * cin, cout) for u in units]
        else:  # (n, in, c): the units side by side along the output
            dense = [u.permute(1, 0, 2).reshape(cin, n * cout).contiguous() for u in units]
        linear = [w.t().contiguous() for w in dense]
        weight = units[0].numel() * units[0].element_size()
        for t in tokens:
            if row_parallel:
                xa = torch.randn(n, t, cin, device=units[0].device, dtype=units[0].dtype)
                x2 = xa.transpose(0, 1).reshape(t, n * cin)
                variants = {
                    "unit": lambda xa=xa, ws=units: [tree_sum(torch.bmm(xa, u)) for u in ws],
                    "dense": lambda x2=x2, ws=dense: [x2 @ w for w in ws],
                    "linear": lambda x2=x2, ws=linear: [torch.nn.functional.linear(x2, w) for w in ws],
                    # the --proj-split variant's GEMM: fp32 partials, their sum left to the next fused norm
                    **{f"split{k}": lambda x2=x2, ws=dense, k=k: [split_k(x2, w, k) for w in ws] for k in (2, 4, 8)},
                }
            else:
                x = torch.randn(1, t, h, device=units[0].device, dtype=units[0].dtype)
                variants = {
                    "unit": lambda x=x, ws=units: [torch.matmul(x, u) for u in ws],
                    "dense": lambda x=x, ws=dense: [x[0] @ w for w in ws],
                    "linear": lambda x=x, ws=linear: [torch.nn.functional.linear(x[0], w) for w in ws],
                }
            xs = x2 if row_parallel else x[0]
            ws = dense if row_parallel else units
            want = xs @ dense[0]
            best = None
            c = dense[0].shape[1] if row_parallel else cout
            engine = config_for(
                xs.shape[1], dense[0].shape[1], c, torch.cuda.get_device_properties(0).multi_processor_count
            )
            for cfg in [engine, *GEMV_SWEEP]:  # gemv.py's split-K GEMV: checked against cuBLAS, then timed
                if c % cfg[1]:
                    continue
                got = gemv(xs, ws[0], cfg)
                err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                if err > 1e-2:
                    print(f"  gemm {proj} T={t} triton {cfg}: relative error {err:.2e}, skipped", flush=True)
                    continue
                us = graphed(lambda xs=xs, ws=ws, cfg=cfg: [gemv(xs, w, cfg) for w in ws])
                if cfg is engine:
                    rows.append(
                        {"proj": proj, "tokens": t, "layout": "triton-engine", "config": list(cfg), "us": round(us, 2),
                         "tbs": round(weight / us / 1e6, 2)}
                    )  # fmt: skip
                    print(f"  gemm {proj:8s} T={t} triton-engine {us:8.2f} us  {weight / us / 1e6:5.2f} TB/s {cfg}")
                if best is None or us < best[0]:
                    best = (us, cfg)
            if best is not None:
                rows.append(
                    {
                        "proj": proj,
                        "tokens": t,
                        "layout": "triton",
                        "config": list(best[1]),
                        "us": round(best[0], 2),
                        "tbs": round(weight / best[0] / 1e6, 2),
                    }
                )
                print(
                    f"  gemm {proj:8s} T={t} triton {best[0]:8.2f} us  {weight / best[0] / 1e6:5.2f} TB/s "
                    f"(block_k, block_n, split_k, stages, warps = {best[1]})",
                    flush=True,
                )
            for name, fn in variants.items():
                us = graphed(fn)
                rows.append(
                    {"proj": proj, "tokens": t, "layout": name, "us": round(us, 2), "tbs": round(weight / us / 1e6, 2)}
                )
                print(f"  gemm {proj:8s} T={t} {name:6s} {us:8.2f} us  {weight / us / 1e6:5.2f} TB/s", flush=True)
        variants = dense = linear = None  # the copies (~14 GB for all four) go before the next projection
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict], base: dict) -> str:
    lines = [
        "| steps | accept len (forced / measured) | cycle ms [95% CI] | roofline ms | ratio | tok/s | "
        "speedup vs baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in [base, *rows]:
        forced = "baseline" if r["steps"] == 0 else f"{r['accept_len_forced']} / {r['accept_len_measured']}"
        speed = "" if r["steps"] == 0 else f"{r['tok_s'] / base['tok_s']:.2f}x"
        lo, hi = r["cycle_ms_ci95"]
        lines.append(
            f"| {r['steps']} | {forced} | {r['cycle_ms']:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{r['roofline_ms']:.3f} | {r['ratio']:.2f} | {r['tok_s']:.1f} | {speed} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama31_8b_shape")
    ap.add_argument("--drafter", default="llama31_8b_shape_eagle3")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", default="1,3,5", help="speculative cells; none: the decode step (baseline) only")
    ap.add_argument("--accept-lens", default="2.0,3.5", help="forced; a value above steps+1 is skipped")
    ap.add_argument("--token-mode", default="real-draft-token", choices=("fixed", "real-draft-token"))
    ap.add_argument("--tokens", type=int, default=400, help="new tokens of the long generation")
    ap.add_argument("--short", type=int, default=40, help="new tokens of the short one (its prefill cancels)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--bandwidth-tbs",
        default="auto",
        help="the roofline's read rate: TB/s (4.3: an H200's achievable HBM3e reads), 'measured' (the rate the "
        "target's lm_head GEMV reaches on this card, read_rate_tbs), or auto (the default: 4.3 on an H200, where "
        "the committed numbers use it, measured on any other card or a CPU)",
    )
    ap.add_argument(
        "--attention",
        default="auto",
        help="the static path's attention, comma-separated to compare: auto (the engine's choice: slots when "
        "compiled on CUDA, else bmm), bmm (SDPA for a grouped-query target), sdpa, slots (Triton, in place), slots1 "
        "(the same in one kernel a layer)",
    )
    ap.add_argument(
        "--overlap",
        default="on",
        help="the decode loop's overlap scheduler (SGLang's default, the server's): on, off, or off,on to "
        "compare (interleaved within each repeat, the same runners)",
    )
    ap.add_argument(
        "--compile",
        default="off",
        help="torch.compile of the static shapes (StaticRunner compile, the server's --enable-torch-compile): "
        "off, on, or off,on to compare; crossed with --attention",
    )
    ap.add_argument(
        "--pdl",
        default="off",
        help="inductor's programmatic dependent launch (torch._inductor.config.triton.enable_pdl, "
        "TORCHINDUCTOR_ENABLE_PDL): a compiled kernel's start overlaps the previous kernel's tail on sm90; off, "
        "on, or off,on to compare (each its own runners; with --compile on only)",
    )
    ap.add_argument(
        "--proj-split",
        default="0",
        help="with --compile on: o_proj and down_proj as that many fp32 partials whose sum inductor fuses into "
        "the next norm (StaticRunner proj_split), in place of cuBLAS's split-K reduce kernels; 0 = one GEMM "
        "each (the engine's); comma-separated to compare, e.g. 0,4 (each its own runners)",
    )
    ap.add_argument(
        "--pin-puts",
        default="off",
        choices=("off", "on"),
        help="StaticRunner.pin_puts: the graphs' host values copied from pinned memory (on) or pageable (off)",
    )
    ap.add_argument(
        "--kernels", action="store_true", help="CUDA: the baseline decode graph's GPU us and kernels by time"
    )
    ap.add_argument(
        "--gemm-micro",
        action="store_true",
        help="CUDA: each projection's GEMM in the per-unit, dense and linear layouts (us, TB/s), then exit",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "outputs")) + "/real_shape")
    args = ap.parse_args(argv)
    if set(args.pdl.split(",")) - {"off", "on"}:
        ap.error(f"--pdl {args.pdl}: off, on or off,on")
    try:
        splits = [int(v) for v in args.proj_split.split(",")]
    except ValueError:
        splits = [-1]
    if any(v < 0 or v == 1 for v in splits):
        ap.error(f"--proj-split {args.proj_split}: 0 (one GEMM) or a split count >= 2, comma-separated")
    bandwidth_asked = args.bandwidth_tbs
    if args.bandwidth_tbs == "auto":  # an H200's constant on an H200 only: another card gets its own rate
        cuda = args.device.startswith("cuda") and torch.cuda.is_available()
        name = torch.cuda.get_device_name(args.device) if cuda else ""
        on_h200 = "H200" in name and "GH200" not in name  # a GH200's HBM3 reads slower than an H200's HBM3e
        args.bandwidth_tbs = str(H200_READ_TBS) if on_h200 else "measured"
    if args.bandwidth_tbs != "measured":
        try:
            args.bandwidth_tbs = float(args.bandwidth_tbs)
        except ValueError:
            args.bandwidth_tbs = float("nan")
        if not (math.isfinite(args.bandwidth_tbs) and args.bandwidth_tbs > 0):
            ap.error(f"--bandwidth-tbs {bandwidth_asked}: a positive number of TB/s, 'measured' or 'auto'")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    gen_device = "cuda" if args.device.startswith("cuda") else "cpu"
    for line in synthetic.ensure(args.model, args.drafter, gen_device, root=ROOT):
        print(line, flush=True)
    generate_s = time.monotonic() - t0
    with torch.no_grad():
        target, drafter = load_pair(args.model, args.drafter, args.device)
        load_s = time.monotonic() - t0 - generate_s
        print(f"loaded in {load_s:.1f} s ({args.device}, {target.lm_head.weight.dtype})", flush=True)
        read_rate = read_rate_tbs(target, args.device)
        print(
            f"lm_head GEMV: {read_rate['median_us']} us for {read_rate['bytes'] / 1e9:.3f} GB, {read_rate['tbs']} TB/s"
        )
        read_rate["roofline_uses"] = (
            "measured" if args.bandwidth_tbs == "measured" else f"{args.bandwidth_tbs} TB/s ({bandwidth_asked})"
        )
        if args.bandwidth_tbs == "measured":
            args.bandwidth_tbs = read_rate["tbs"]
        if args.gemm_micro:
            (out / "gemm_micro.json").write_text(json.dumps(gemm_micro(target), indent=2) + "\n")
            return 0
        variants, failed = {}, {}
        for pdl in args.pdl.split(","):
            set_pdl(pdl == "on")
            for attention in args.attention.split(","):
                for comp in args.compile.split(","):
                    for split in splits if comp == "on" else [0]:  # a split is a compiled path's variant
                        name = attention + ("" if comp == "off" else "+compile") + ("+pdl" if pdl == "on" else "")
                        name += f"+split{split}" if split else ""
                        try:
                            variants.update(measure_all(target, drafter, args, attention, comp == "on", name, split))
                        except Exception as e:  # a split that cannot run on this torch: said, the rest still run
                            if not split:
                                raise
                            failed[name] = f"{type(e).__name__}: {e}"[:2000]
                            print(f"[{name}] FAILED, skipped: {failed[name]}", flush=True)
    for attention, v in variants.items():
        write_variant(out, args, attention, v, multiple=len(variants) > 1)
    if not variants:  # every variant failed: what failed is the record
        record = {"torch": torch.__version__, "args": vars(args), "failed_variants": failed}
        (out / "real_shape.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"every variant failed: {failed}", file=sys.stderr)
        return 1
    record = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "args": vars(args),
        **next(iter(variants.values())),
        "variants": variants,
        "failed_variants": failed,
        "read_rate": read_rate,
        "generate_s": round(generate_s, 1),
        "load_s": round(load_s, 1),
        "loadavg": os.getloadavg(),
    }
    record["verdict"], record["facts"] = verdict_and_facts(args, record["baseline"], record["rows"])
    (out / "real_shape.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


def measure_all(target, drafter, args, attention: str, compile: bool, label: str, split: int = 0) -> dict[str, dict]:
    """The baseline and every (steps, accept length) cell with one attention (and compile) variant, per
    overlap mode: {variant name: {"baseline": ..., "rows": [...]}}."""
    modes = args.overlap.split(",")
    name = {m: label + (f"+overlap-{m}" if len(modes) > 1 else "") for m in modes}
    out = {name[m]: {"baseline": None, "rows": []} for m in modes}
    positions = context(args)
    runner = runner_for(target, None, 1, args.device, attention, compile, args.pin_puts == "on", split)
    for m, base in measure(target, None, 0, None, args, runner).items():
        base.update(roofline(target, None, 0, args.bandwidth_tbs, positions))
        base["ratio"] = round(base["cycle_ms"] / base["roofline_ms"], 3)
        base["attention"], base["compile"] = runner.attention if runner else attention, compile
        base["proj_split"] = runner.proj_split if runner else 0
        out[name[m]]["baseline"] = base
        print(
            f"[{name[m]}] baseline: {base['cycle_ms']:.3f} ms/step (roofline {base['roofline_ms']:.3f}), "
            f"{base['tok_s']:.1f} tok/s",
            flush=True,
        )
    if args.kernels and runner is not None and "decode@1" in runner.graphs:
        graph = graph_kernels(runner)
        for m in modes:
            out[name[m]]["baseline"]["graph"] = graph
        print(
            f"[{label}] decode graph: {graph['decode_gpu_us']} us GPU per replay, {graph['kernels']:.0f} kernels "
            f"(GEMMs {graph['gemm_kernels']:.0f} in {graph['gemm_us']} us, others {graph['other_kernels']:.0f} in "
            f"{graph['other_us']} us)"
        )
        print(f"[{label}] one layer's K slot gathered (us per call): {graph['slot_gather_us']}")
        for gaps in graph["loop_gaps"]:
            print(f"[{label}] decode loop, profiled: {gaps}")
        for kname, c, us in graph["top"]:
            print(f"  {us:8.1f} us  x{c:4.0f}  {kname}")
    del runner
    for steps in [] if args.steps == "none" else [int(s) for s in args.steps.split(",")]:
        runner = runner_for(target, drafter, steps, args.device, attention, compile, args.pin_puts == "on", split)
        for x in [float(v) for v in args.accept_lens.split(",")]:
            if x > steps + 1:
                continue
            cycle = None
            if args.kernels and runner is not None and runner.graphs:
                cycle = cycle_kernels(runner, drafter, steps, x, args.token_mode)
                print(f"[{label}] steps {steps} accept {x}, graphs and loop: {cycle}", flush=True)
            for m, row in measure(target, drafter, steps, x, args, runner).items():
                row.update(roofline(target, drafter, steps, args.bandwidth_tbs, positions))
                row["ratio"] = round(row["cycle_ms"] / row["roofline_ms"], 3)
                if cycle is not None:
                    row["graph"] = cycle
                out[name[m]]["rows"].append(row)
                print(
                    f"[{name[m]}] steps {steps} accept {x}: cycle {row['cycle_ms']:.3f} ms (roofline "
                    f"{row['roofline_ms']:.3f}, ratio {row['ratio']:.2f}), {row['tok_s']:.1f} tok/s",
                    flush=True,
                )
        del runner
    return out


def host_gap_ms(row: dict) -> float | None:
    """A measured cycle (or baseline step) minus the GPU time of the graphs it replays (--kernels), or None."""
    graph = row.get("graph") or {}
    gpu_us = graph.get("graphs_us_per_cycle", graph.get("decode_gpu_us"))
    return None if gpu_us is None else round(row["cycle_ms"] - gpu_us / 1e3, 3)


def verdict_and_facts(args, base: dict, rows: list[dict]) -> tuple[str, str]:
    worst = max([base, *rows], key=lambda r: r["ratio"])
    verdict = (
        f"must show (cycle within {MUST_SHOW_RATIO:.2f}x of the roofline estimate at tp 1): "
        f"{'PASS' if worst['ratio'] <= MUST_SHOW_RATIO else 'FAIL'} (worst ratio {worst['ratio']:.2f}, "
        f"steps {worst['steps']})"
    )
    gaps = [(host_gap_ms(r), r) for r in [base, *rows] if host_gap_ms(r) is not None]
    if gaps:
        gap, r = max(gaps, key=lambda x: x[0] / x[1]["cycle_ms"])
        verdict += (
            f"; host: the cycle exceeds its CUDA graphs' GPU time by at most {gap:.3f} ms ({gap / r['cycle_ms']:.1%}, "
            f"steps {r['steps']}): {'GPU-bound' if gap <= 0.05 * r['cycle_ms'] else 'host time in the cycle'}"
        )
    facts = (
        f"target {args.model}: {base['target_weight_bytes'] / 1e9:.2f} GB of weights read per forward (embedding excluded) + "
        f"{base['target_kv_bytes'] / 1e9:.3f} GB K/V of the context (mean position {base['context_positions']:.0f}); "
        f"drafter {args.drafter}: "
        f"{rows[0]['drafter_weight_bytes'] / 1e9:.3f} GB + {rows[0]['drafter_kv_bytes'] / 1e9:.4f} GB KV per "
        f"forward; bandwidth {args.bandwidth_tbs} TB/s; roofline = target / bw + steps x drafter / bw"
        if rows
        else ""
    )
    return verdict, facts


def write_variant(out: Path, args, attention: str, v: dict, multiple: bool) -> None:
    base, rows = v["baseline"], v["rows"]
    md = table(rows, base)
    verdict, facts = verdict_and_facts(args, base, rows)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    name = f"real_shape_{attention.replace('+', '_')}.md" if multiple else "real_shape.md"
    (out / name).write_text(
        f"{device_name}, {args.model} + {args.drafter}, tp 1, token mode "
        f"{args.token_mode}, variant {attention}\n\n{md}\n\n{facts}\n\n{verdict}\n"
    )
    print(f"\n## variant {attention}\n{md}")
    print(facts)
    print(verdict)


if __name__ == "__main__":
    sys.exit(main())
