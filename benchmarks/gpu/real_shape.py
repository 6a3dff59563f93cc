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
each (drafter weights + its KV cache) / bandwidth. Bandwidth: ``--bandwidth-tbs`` (4.3 TB/s, an H200's
achievable HBM3e read rate, below its 4.8 TB/s peak). Compute, kernel launches and the host are not in
it: ``ratio`` = measured / estimate says how far from weight-bound the engine is (must show: <= 1.25).

Writes ``real_shape.json`` (every number) and ``real_shape.md`` (the table) under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from spec_decode.analysis.stats import summarize
from spec_decode.engines.embedded import synthetic
from spec_decode.engines.embedded.decoding import Decoder, ForcedAcceptance
from spec_decode.engines.embedded.graphs import StaticRunner
from spec_decode.engines.embedded.kvcache import slot_rows
from spec_decode.engines.embedded.model import load_drafter, load_target

ROOT = Path(__file__).resolve().parents[2]
PROMPT = b"def fibonacci(n):\n    # return the n-th Fibonacci number\n"
MUST_SHOW_RATIO = 1.25


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


def kv_bytes(model, layers: int) -> int:
    """The static KV cache of one model: our CUDA path attends over every slot at every step."""
    s = model.shape
    return (
        2
        * layers
        * s.num_key_value_heads
        * s.max_position_embeddings
        * s.head_dim
        * model.lm_head.weight.element_size()
    )


def roofline(target, drafter, steps: int, bandwidth_tbs: float) -> dict:
    bw = bandwidth_tbs * 1e12
    t_w, t_kv = target_bytes(target), kv_bytes(target, target.shape.num_hidden_layers)
    d_w, d_kv = (drafter_bytes(drafter), kv_bytes(drafter, 1)) if drafter is not None else (0, 0)
    target_ms, drafter_ms = (t_w + t_kv) / bw * 1e3, (d_w + d_kv) / bw * 1e3
    return {
        "target_weight_bytes": t_w,
        "target_kv_bytes": t_kv,
        "drafter_weight_bytes": d_w,
        "drafter_kv_bytes": d_kv,
        "bandwidth_tbs": bandwidth_tbs,
        "target_forward_ms": round(target_ms, 4),
        "drafter_forward_ms": round(drafter_ms, 4),
        "roofline_ms": round(target_ms + steps * drafter_ms, 4),
    }


def timed(decoder: Decoder, ids: list[int], n: int, device: str, forced: ForcedAcceptance | None):
    if forced is not None:
        forced.generator.manual_seed(0)
    sync(device)
    t0 = time.perf_counter()
    gen = decoder.generate(ids, n)
    sync(device)
    return time.perf_counter() - t0, gen


def measure(target, drafter, steps: int, accept_len: float | None, args, runner) -> dict:
    forced = ForcedAcceptance(accept_len, steps, token_mode=args.token_mode, seed=0) if drafter is not None else None
    decoder = Decoder(target, drafter, steps, runner, forced)
    ids = list(PROMPT)
    timed(decoder, ids, args.short, args.device, forced)  # warm (lazy inits, allocator)
    cycles, tok_s = [], []
    for _ in range(args.repeats):
        w_short, g_short = timed(decoder, ids, args.short, args.device, forced)
        w_long, g_long = timed(decoder, ids, args.tokens, args.device, forced)
        if drafter is None:
            n_short, n_long = g_short.decode_steps, g_long.decode_steps
        else:
            n_short, n_long = g_short.verify_ct, g_long.verify_ct
        cycles.append((w_long - w_short) / (n_long - n_short) * 1e3)
        tok_s.append(len(g_long.output_ids) / w_long)
    cyc, tps = summarize(cycles), summarize(tok_s)
    accept = len(g_long.output_ids) / g_long.verify_ct if drafter is not None else 1.0
    return {
        "steps": steps,
        "accept_len_forced": accept_len,
        "accept_len_measured": round(accept, 3),
        "cycle_ms": round(cyc.median, 4),
        "cycle_ms_ci95": [round(cyc.ci95_lo, 4), round(cyc.ci95_hi, 4)],
        "cycle_ms_runs": [round(c, 4) for c in cycles],
        "tok_s": round(tps.median, 1),
        "tok_s_ci95": [round(tps.ci95_lo, 1), round(tps.ci95_hi, 1)],
        "cuda_graph": decoder.cuda_graph,
    }


def runner_for(target, drafter, steps: int, device: str, attention: str = "bmm", compile: bool = False):
    if not device.startswith("cuda"):
        return None  # the CPU rank decodes eagerly (scheduler.run_rank does the same)
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.monotonic()
    runner = StaticRunner(target, drafter, steps, use_graphs=True, attention=attention, compile=compile)
    print(
        f"  runner (steps {steps}, compile {compile}): {time.monotonic() - t0:.1f} s to build and capture", flush=True
    )
    if runner.capture_error:
        print(f"  capture failed, eager: {runner.capture_error}", flush=True)
    return runner


def graph_kernels(runner, top: int = 14) -> dict:
    """The baseline's decode graph (decode@1): GPU us per replay (CUDA events over back-to-back replays),
    kernels per replay and the kernels by total time (torch.profiler), as engine_profile.py measures."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_profile import gpu_us, kernels  # benchmarks/gpu is scripts, not a package: by path

    graph = runner.graphs["decode@1"]
    us, host = gpu_us(graph.replay)
    count, by_time = kernels(graph.replay)
    return {
        "decode_gpu_us": round(us, 1),
        "host_us": round(host, 1),
        "kernels": count,
        "top": [[name, c, round(t, 1)] for name, c, t in by_time[:top]],
        "slot_gather_us": gather_micro(runner, gpu_us),
    }


def gather_micro(runner, gpu_us) -> dict:
    """One layer's K slot gathered for one row, torch's index_select against kvcache.slot_rows (8-byte
    words), as GPU us per call: 32 calls captured in one graph (a decode step's layers), interleaved sets."""
    kl, ids = runner.tcache.k[0], runner.bufs["decode@1"]["slots"]
    assert torch.equal(slot_rows(kl, ids), kl.index_select(0, ids))
    out = {}
    for name, fn in (("index_select", lambda: kl.index_select(0, ids)), ("slot_rows", lambda: slot_rows(kl, ids))):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(32):
                fn()
        out[name] = round(gpu_us(g.replay)[0] / 32, 2)
    return out


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
    ap.add_argument("--steps", default="1,3,5")
    ap.add_argument("--accept-lens", default="2.0,3.5", help="forced; a value above steps+1 is skipped")
    ap.add_argument("--token-mode", default="real-draft-token", choices=("fixed", "real-draft-token"))
    ap.add_argument("--tokens", type=int, default=400, help="new tokens of the long generation")
    ap.add_argument("--short", type=int, default=40, help="new tokens of the short one (its prefill cancels)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bandwidth-tbs", type=float, default=4.3)
    ap.add_argument(
        "--attention",
        default="bmm",
        help="the static path's attention, comma-separated to compare (bmm: the engine's default; sdpa)",
    )
    ap.add_argument(
        "--compile",
        default="off",
        help="torch.compile of the static shapes (StaticRunner compile, the server's --enable-torch-compile): "
        "off, on, or off,on to compare; crossed with --attention",
    )
    ap.add_argument(
        "--kernels", action="store_true", help="CUDA: the baseline decode graph's GPU us and kernels by time"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "outputs")) + "/real_shape")
    args = ap.parse_args(argv)
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
    mconf = synthetic.read_conf("model", args.model)
    dconf = synthetic.read_conf("drafter", args.drafter)
    generate_s = time.monotonic() - t0
    with torch.no_grad():
        target = load_target(ROOT / mconf["path"], args.device)
        drafter = load_drafter(ROOT / dconf["path"], target, args.device)
        drop_training_copies(target)
        load_s = time.monotonic() - t0 - generate_s
        print(f"loaded in {load_s:.1f} s ({args.device}, {target.lm_head.weight.dtype})", flush=True)
        variants = {}
        for attention in args.attention.split(","):
            for comp in args.compile.split(","):
                name = attention if comp == "off" else f"{attention}+compile"
                base, rows = measure_all(target, drafter, args, attention, comp == "on", name)
                variants[name] = {"baseline": base, "rows": rows}
    for attention, v in variants.items():
        write_variant(out, args, attention, v, multiple=len(variants) > 1)
    record = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "args": vars(args),
        **next(iter(variants.values())),
        "variants": variants,
        "generate_s": round(generate_s, 1),
        "load_s": round(load_s, 1),
        "loadavg": os.getloadavg(),
    }
    record["verdict"], record["facts"] = verdict_and_facts(args, record["baseline"], record["rows"])
    (out / "real_shape.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


def measure_all(target, drafter, args, attention: str, compile: bool, label: str) -> tuple[dict, list[dict]]:
    """The baseline and every (steps, accept length) cell with one attention (and compile) variant."""
    runner = runner_for(target, None, 1, args.device, attention, compile)
    base = {**measure(target, None, 0, None, args, runner), **roofline(target, None, 0, args.bandwidth_tbs)}
    base["ratio"] = round(base["cycle_ms"] / base["roofline_ms"], 3)
    base["attention"], base["compile"] = attention, compile
    print(
        f"[{label}] baseline: {base['cycle_ms']:.3f} ms/step (roofline {base['roofline_ms']:.3f}), "
        f"{base['tok_s']:.1f} tok/s",
        flush=True,
    )
    if args.kernels and runner is not None and "decode@1" in runner.graphs:
        base["graph"] = graph_kernels(runner)
        g = base["graph"]
        print(f"[{label}] decode graph: {g['decode_gpu_us']} us GPU per replay, {g['kernels']:.0f} kernels")
        print(f"[{label}] one layer's K slot gathered (us per call): {g['slot_gather_us']}")
        for name, c, us in g["top"]:
            print(f"  {us:8.1f} us  x{c:4.0f}  {name}")
    del runner
    rows = []
    for steps in [int(s) for s in args.steps.split(",")]:
        runner = runner_for(target, drafter, steps, args.device, attention, compile)
        for x in [float(v) for v in args.accept_lens.split(",")]:
            if x > steps + 1:
                continue
            row = {
                **measure(target, drafter, steps, x, args, runner),
                **roofline(target, drafter, steps, args.bandwidth_tbs),
            }
            row["ratio"] = round(row["cycle_ms"] / row["roofline_ms"], 3)
            rows.append(row)
            print(
                f"[{label}] steps {steps} accept {x}: cycle {row['cycle_ms']:.3f} ms (roofline "
                f"{row['roofline_ms']:.3f}, ratio {row['ratio']:.2f}), {row['tok_s']:.1f} tok/s",
                flush=True,
            )
        del runner
    return base, rows


def verdict_and_facts(args, base: dict, rows: list[dict]) -> tuple[str, str]:
    worst = max([base, *rows], key=lambda r: r["ratio"])
    verdict = (
        f"must show (cycle within {MUST_SHOW_RATIO:.2f}x of the roofline estimate at tp 1): "
        f"{'PASS' if worst['ratio'] <= MUST_SHOW_RATIO else 'FAIL'} (worst ratio {worst['ratio']:.2f}, "
        f"steps {worst['steps']})"
    )
    facts = (
        f"target {args.model}: {base['target_weight_bytes'] / 1e9:.2f} GB of weights read per forward (embedding excluded) + "
        f"{base['target_kv_bytes'] / 1e9:.3f} GB static KV cache; drafter {args.drafter}: "
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
