"""Paired-baseline variants against each other, interleaved in one run (issue 16: a speedup CI
half-width <= 3% at 5 x 500 tokens).

    python benchmarks/pairing.py                      # steps=3, 6 blocks x 5 pairs, all variants
    python benchmarks/pairing.py --steps 1 --blocks 4 --variants interleaved,concurrent

One spec server and one baseline server (the job's own launch code, the default protocol: 500 greedy
tokens, 1 warmup, /flush_cache) stay up; each block measures every variant once, in rotating order,
each variant taking the job's 5 pairs, so all variants see the same stretch of machine weather.
Per variant: the paired speedup of each block (stats.paired_ratio), its 95% CI half-width, the bias of
the median speedup against interleaved (what `benchmark.pairing=interleaved` measures), the arms'
median tok/s, how much of the shorter run both were in flight, and the client's share (client
wall time minus the server's e2e_latency) so that a client bottleneck would show.

Variants (spec_decode/runner/pairing.py):
  interleaved       one arm after the other, ABBA, servers unpinned (the job's benchmark.pairing=interleaved)
  concurrent        both at once, each server pinned to its own half of the cores, halves swapped per
                    pair, midpoints aligned (benchmark.pairing=concurrent)
  concurrent-start  as concurrent but both started together (no midpoint alignment)
  *-nice            the same with both servers' scheduler autogroups at --nice (CPU weight against
                    other sessions' work on the machine; needs root)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spec_decode.analysis import stats  # noqa: E402
from spec_decode.core.config import register_configs, to_experiment  # noqa: E402
from spec_decode.core.prompts import load_prompts  # noqa: E402
from spec_decode.engines import server_extra_env, start_server  # noqa: E402
from spec_decode.runner import pairing  # noqa: E402
from spec_decode.runner.baselines import baseline_config  # noqa: E402
from spec_decode.runner.client import Client  # noqa: E402

VARIANTS = ("interleaved", "concurrent", "concurrent-start", "interleaved-nice", "concurrent-nice")


def block(variant: str, pairs: int, spec_pid: int, base_pid: int, generate, expected: dict, nice: int) -> list[tuple]:
    """One variant's pairs: [(spec RunRecord, base RunRecord, info)]."""
    for pid in (spec_pid, base_pid):
        pairing.set_group_nice(pid, nice if variant.endswith("-nice") else 0)
        if variant.startswith("interleaved"):  # unpinned, as the job runs it
            pairing.pin_tree(pid, set(pairing.usable_cores()))
    mode = pairing.INTERLEAVED if variant.startswith("interleaved") else pairing.CONCURRENT
    p = pairing.Pairer(mode, spec_pid, base_pid, expected_s=dict(expected))
    out = []
    for i in range(pairs):
        if variant == "concurrent-start":
            p.expected_s = {}  # no midpoint alignment: both released together
        out.append(p.run(i, generate["spec"], generate["base"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=6, help="rounds; each measures every variant once")
    ap.add_argument("--pairs", type=int, default=5, help="pairs per variant per block (the job's runs)")
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--nice", type=int, default=-10, help="autogroup nice of the *-nice variants")
    args = ap.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_experiment(compose("config", overrides=[f"spec.steps={args.steps}", "tracking=off"]))
    bcfg = baseline_config(cfg)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"pairing_bench_{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the configs' relative model paths
    load0 = os.getloadavg()
    t0 = time.time()
    spec = start_server(cfg, server_extra_env(cfg, str(out / "profile.jsonl")), out / "spec.server.log", any_port=True)
    try:
        base = start_server(bcfg, server_extra_env(bcfg, None), out / "baseline.server.log", any_port=True)
        try:
            clients = {"spec": Client(spec.base_url, 600), "base": Client(base.base_url, 600)}
            prompt = load_prompts(ROOT / cfg.benchmark.prompts)[cfg.benchmark.prompt_index]
            body = clients["spec"].generate_body(prompt, args.tokens, 0.0, True)
            expected = {arm: c.generate(body, 0, -1).wall_s for arm, c in clients.items()}
            for c in clients.values():
                c.flush_cache()
            generate = {arm: (lambda c=c: c.generate(body, 0, 0)) for arm, c in clients.items()}
            results: dict[str, list[list[tuple]]] = {v: [] for v in variants}
            for b in range(args.blocks):
                for v in variants[b % len(variants) :] + variants[: b % len(variants)]:  # rotate the order
                    pairs = block(v, args.pairs, spec.pid, base.pid, generate, expected, args.nice)
                    results[v].append(pairs)
                    r = stats.paired_ratio(
                        [s.throughput_tok_s for s, _, _ in pairs], [x.throughput_tok_s for _, x, _ in pairs]
                    )
                    print(
                        f"block {b} {v:17s} {r.ratio:.3f}x +-{halfwidth_pct(r):.1f}%  load {os.getloadavg()[0]:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            base.stop()
    finally:
        spec.stop()
    load1 = os.getloadavg()
    raw = {
        v: [[{"spec": s.as_dict(), "base": x.as_dict(), "info": info} for s, x, info in p] for p in blocks]
        for v, blocks in results.items()
    }
    (out / "pairs.json").write_text(json.dumps(raw))
    print(f"raw pairs: {out / 'pairs.json'}", file=sys.stderr)
    print(
        f"\nspec.steps={args.steps}, {args.blocks} blocks x {args.pairs} pairs x {args.tokens} tokens per variant, "
        f"{len(pairing.usable_cores())} cores; load average (1 min) {load0[0]:.2f} before, {load1[0]:.2f} after; "
        f"{time.time() - t0:.0f} s\n"
    )
    print_table(results)


def halfwidth_pct(r: stats.Ratio) -> float:
    """The 95% CI half-width as % of the speedup (as results.py's speedup_ci95_halfwidth_pct)."""
    return 100 * (r.ci95_hi - r.ci95_lo) / 2 / r.ratio


def print_table(results: dict[str, list[list[tuple]]]) -> None:
    rows = {}
    for v, blocks in results.items():
        ratios = [
            stats.paired_ratio([s.throughput_tok_s for s, _, _ in p], [x.throughput_tok_s for _, x, _ in p])
            for p in blocks
        ]
        runs = [t for p in blocks for t in p]
        overlap = [info["overlap_s"] / min(s.wall_s, x.wall_s) for s, x, info in runs if "overlap_s" in info]
        client_ms = [1000 * (r.wall_s - r.e2e_latency_s) for s, x, _ in runs for r in (s, x) if r.e2e_latency_s]
        rows[v] = dict(
            speedup=statistics.median(r.ratio for r in ratios),
            hw=[halfwidth_pct(r) for r in ratios],
            spec=statistics.median(s.throughput_tok_s for s, _, _ in runs),
            base=statistics.median(x.throughput_tok_s for _, x, _ in runs),
            overlap=statistics.median(overlap) if overlap else None,
            client_ms=statistics.median(client_ms) if client_ms else math.nan,
        )
    ref = rows.get("interleaved", {}).get("speedup")  # the bias reference: the unpinned ABBA
    print(
        "| variant | blocks | median speedup | median half-width | max half-width | blocks <= 3% | "
        "bias vs interleaved | spec tok/s | base tok/s | overlap of shorter run | client ms/request |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for v, r in rows.items():
        bias = f"{100 * (r['speedup'] / ref - 1):+.1f}%" if ref and v != "interleaved" else "—"
        ov = f"{100 * r['overlap']:.0f}%" if r["overlap"] is not None else "—"
        print(
            f"| {v} | {len(r['hw'])} | {r['speedup']:.3f}x | {statistics.median(r['hw']):.1f}% | {max(r['hw']):.1f}% | "
            f"{sum(h <= 3 for h in r['hw'])}/{len(r['hw'])} | {bias} | {r['spec']:.0f} | {r['base']:.0f} | {ov} | "
            f"{r['client_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
