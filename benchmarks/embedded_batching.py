"""Embedded engine under load: aggregate tok/s at several concurrencies, baseline vs EAGLE-3, and the
overlap scheduler on vs off (issue 26).

    python benchmarks/embedded_batching.py                            # CPU: concurrency 1, 4, 16
    python benchmarks/embedded_batching.py --rounds 3 --tokens 64     # shorter
    python benchmarks/embedded_batching.py --paths static,eager       # CPU: the static path's shapes too
    timeout 900 python benchmarks/embedded_batching.py --device cuda  # one GPU, CUDA graphs
    timeout 900 python benchmarks/embedded_batching.py --device cuda --concurrency 1,2,4,8,16,32 --paths static,eager

Every variant is a real rank group (the server's own processes, ``ranks.RankGroup``, no HTTP), all
started first, then timed in interleaved rounds (for each round, for each concurrency, every variant
in turn), so machine noise hits all of them alike. At concurrency c, c calls (prompts 0..c-1 of
``data/prompts.jsonl``, cycled, each ``--tokens`` new tokens) are sent at once from c threads; the
aggregate tok/s is c x tokens / the wall time until the last answer. The table gives medians over the
rounds, the speedup of each variant over the baseline as the median of per-round ratios, and the same as
a geometric mean with a 95% interval (``stats.paired_ratio``: the rounds are the pairs); a last table
says per variant where speculation stops paying under load (issue 41's crossover). Those intervals hold
the rounds' noise within one start of each group, not launch-to-launch noise. "lossless":
every output at every concurrency equals the baseline's output for that prompt sent alone.
Overlap off (``--disable-overlap-schedule``) runs at the concurrencies of ``--overlap-off-at`` (default 1);
``--steps`` lists the speculative variants (default 3), each with overlap on and off, so
``--steps 1,3,5 --concurrency 1,8 --overlap-off-at 1,8`` is issue 41's side-by-side table. ``--accept``
adds forced-acceptance variants (SGLANG_SIMULATE_ACC_LEN, real-draft-token): with forced counts a cycle
makes no host read of its accepted counts, so on and off there show what the read costs the overlap loop.

``--paths``: ``static`` = the static path (on CUDA its CUDA graphs per batch-size bucket, the server's
default there; on CPU the same shapes eagerly, ``--static-path``), ``eager`` = the packed eager path
(the CPU default; ``--cuda-eager-batching`` on CUDA); default: static on CUDA, eager on CPU. Each path
has its own baseline (speedups are within a path). ``--max-running-requests`` defaults to the largest
concurrency, and so does the graph cap (``--cuda-graph-max-bs-decode``): every batch replays a graph.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from spec_decode.analysis.stats import paired_ratio
from spec_decode.engines.embedded.ranks import RankGroup
from spec_decode.engines.embedded.scheduler import RankSpec
from spec_decode.engines.embedded.tokenizer import encode

ROOT = Path(__file__).resolve().parents[1]


def start(args, steps: int, overlap: bool, path: str, accept: float | None = None) -> RankGroup:
    """One rank group; ``accept``: forced acceptance (its env is read by the ranks as they start)."""
    static = path == "static"
    spec = RankSpec(
        model_path=str(ROOT / "models/tiny/target"),
        draft_model_path=str(ROOT / "models/tiny/drafter") if steps else None,
        steps=steps,
        tp_size=args.tp_size,
        device=args.device,
        cpu_threads=args.threads,
        random_seed=0,
        decode_log_interval=10**9,
        log_level="warning",
        dist_port=0,
        front_pid=0,
        max_running_requests=args.max_running_requests,
        disable_overlap_schedule=not overlap,
        cuda_eager_batching=not static,
        static_path=static and args.device == "cpu",
        cuda_graph_max_bs=args.cuda_graph_max_bs_decode,
    )
    forced = {"SGLANG_SIMULATE_ACC_LEN": str(accept), "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
    saved = {k: os.environ.get(k) for k in forced}
    if accept is not None:
        os.environ.update(forced)
    try:
        return RankGroup(spec)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def burst(group: RankGroup, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    """All prompts at once; (aggregate tok/s, outputs)."""
    outs: list = [None] * len(prompts)

    def one(i: int) -> None:
        outs[i] = group.call("generate", prompts[i], tokens, False)["generation"]["output_ids"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(prompts) * tokens / (time.perf_counter() - t0), outs


def crossover(rows: list[dict], concs: list[int]) -> None:
    """Per speculative variant: the concurrencies where it pays (the speedup's 95% CI above 1), where it
    costs (below 1) and where the rounds cannot tell. The intervals are the rounds' (paired per round,
    Student t on the log ratios) within one start of each rank group: launch-to-launch noise is not in them."""
    print("\n| variant | pays (CI > 1) | cannot tell | costs (CI < 1) | crossover |")
    print("|---|---|---|---|---|")
    for name in dict.fromkeys(r["variant"] for r in rows if r.get("speedup_ci")):
        by_c = {r["concurrency"]: r["speedup_ci"] for r in rows if r["variant"] == name and r.get("speedup_ci")}
        pays = [c for c in concs if c in by_c and by_c[c][0] > 1]
        costs = [c for c in concs if c in by_c and by_c[c][1] < 1]
        unclear = [c for c in concs if c in by_c and c not in pays and c not in costs]
        first_not = next((c for c in concs if c in by_c and c not in pays), None)
        where = "pays at every concurrency" if first_not is None else f"not shown to pay from concurrency {first_not}"
        cells = (",".join(map(str, cs)) or "-" for cs in (pays, unclear, costs))
        print(f"| {name} | {' | '.join(cells)} | {where} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-running-requests", type=int, default=None, help="default: the largest concurrency")
    ap.add_argument("--cuda-graph-max-bs-decode", type=int, default=None, help="default: --max-running-requests")
    ap.add_argument("--paths", default=None, help="static, eager or both (default: static on cuda, eager on cpu)")
    ap.add_argument("--steps", default="3", help="the speculative variants' step counts, e.g. 1,3,5")
    ap.add_argument(
        "--overlap-off-at",
        default="1",
        help="the concurrencies where the overlap-off variants run too (every --steps and the baseline)",
    )
    ap.add_argument(
        "--accept",
        default="",
        help="forced accept lengths for extra variants (e.g. 2.0): the cycle then reads no accepted counts",
    )
    ap.add_argument("--accept-steps", default="3", help="the step counts that get the --accept variants")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no new round after this many seconds (the table then has fewer rounds)",
    )
    args = ap.parse_args()
    texts = [json.loads(line)["text"] for line in (ROOT / "data/prompts.jsonl").read_text().splitlines()]
    concs = [int(x) for x in args.concurrency.split(",")]
    args.max_running_requests = args.max_running_requests or max(concs)
    prompts = [encode(texts[i % len(texts)]) for i in range(max(concs))]
    paths = (args.paths or ("static" if args.device == "cuda" else "eager")).split(",")
    if bad := [p for p in paths if p not in ("static", "eager")]:
        ap.error(f"--paths {args.paths}: {bad} is not static or eager")
    off_at = {int(x) for x in args.overlap_off_at.split(",") if x}
    steps_list = [int(x) for x in args.steps.split(",") if x]
    accepts = [float(x) for x in args.accept.split(",") if x]
    accept_steps = {int(x) for x in args.accept_steps.split(",") if x}
    variants = {}  # name: (steps, overlap, path, forced accept length or None)
    for path in paths:
        tag = "" if len(paths) == 1 else f" [{path}]"
        for overlap in (True, False) if off_at & set(concs) else (True,):  # no overlap-off group never timed
            off = "" if overlap else " overlap-off"
            variants[f"baseline{off}{tag}"] = (0, overlap, path, None)
            for k in steps_list:
                variants[f"steps={k}{off}{tag}"] = (k, overlap, path, None)
                for x in accepts:
                    if k in accept_steps and x <= k + 1:
                        variants[f"steps={k} accept={x}{off}{tag}"] = (k, overlap, path, x)
    groups: dict[str, RankGroup] = {}
    tps: dict[tuple[str, int], list[float]] = {}
    lossless = True
    try:
        for name, (steps, overlap, path, accept) in variants.items():
            groups[name] = start(args, steps, overlap, path, accept)
        ref = {}  # per path: each prompt alone on its baseline (the reference, and the warmup)
        for name, (_, _, path, _) in variants.items():
            if path not in ref:
                ref[path] = [
                    groups[name].call("generate", p, args.tokens, False)["generation"]["output_ids"] for p in prompts
                ]
        for group in groups.values():
            burst(group, prompts, 16)  # warm the batched shapes
        t_start, done = time.monotonic(), 0
        for _ in range(args.rounds):
            if done and args.budget_s is not None and time.monotonic() - t_start > args.budget_s:
                print(f"--budget-s {args.budget_s}: stopped after {done} of {args.rounds} rounds")
                break
            done += 1
            for c in concs:
                for name, group in groups.items():
                    if "overlap-off" in name and c not in off_at:
                        continue
                    rate, outs = burst(group, prompts[:c], args.tokens)
                    tps.setdefault((name, c), []).append(rate)
                    if variants[name][3] is None:  # forced acceptance commits other tokens by design
                        lossless &= outs == ref[variants[name][2]][:c]
    finally:
        for group in groups.values():
            group.close()
    print(
        f"device={args.device} tp={args.tp_size} threads/rank={args.threads} tokens={args.tokens} "
        f"rounds={done} max_running_requests={args.max_running_requests} torch={torch.__version__} "
        f"cpus={os.cpu_count()} loadavg={open('/proc/loadavg').read().split()[:3]}"
    )
    print(
        f"paths: {', '.join(paths)} (static: CUDA graphs per bucket up to "
        f"{args.cuda_graph_max_bs_decode or args.max_running_requests} on cuda, eager shapes on cpu)"
    )
    print(
        "| variant | concurrency | aggregate tok/s (median) | quartiles | speedup vs baseline (median of rounds) "
        "| geometric mean of rounds [95% CI] |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for (name, c), rates in tps.items():
        tag = name[name.index(" [") :] if " [" in name else ""
        base_name = ("baseline overlap-off" if "overlap-off" in name else "baseline") + tag
        base = tps[(base_name, c)]
        q = statistics.quantiles(rates, n=4) if len(rates) > 1 else [rates[0]] * 3
        speed = statistics.median(v / b for v, b in zip(rates, base))
        pr = paired_ratio(rates, base) if name != base_name else None
        rows.append(
            {
                "variant": name,
                "path": variants[name][2],
                "concurrency": c,
                "tok_s": statistics.median(rates),
                "q1": q[0],
                "q3": q[2],
                "speedup": speed,
                "speedup_gmean": pr.ratio if pr else None,
                "speedup_ci": [pr.ci95_lo, pr.ci95_hi] if pr else None,
                "rounds": rates,
            }
        )
        ci = f"{pr.ratio:.3f} [{pr.ci95_lo:.3f}, {pr.ci95_hi:.3f}]" if pr else "-"
        print(f"| {name} | {c} | {statistics.median(rates):.0f} | {q[0]:.0f}-{q[2]:.0f} | {speed:.2f}x | {ci} |")
    crossover(rows, concs)
    print("\n| variant | concurrency | overlap on / off (median of per-round ratios) | per round |")
    print("|---|---|---|---|")
    for name in [n for n in variants if "overlap-off" not in n]:
        tag = name[name.index(" [") :] if " [" in name else ""
        for c in sorted(off_at & set(concs)):
            on, off = tps.get((name, c)), tps.get((name.removesuffix(tag) + " overlap-off" + tag, c))
            if not on or not off:
                continue
            ratios = [a / b for a, b in zip(on, off)]
            rows.append(
                {"variant": name, "concurrency": c, "overlap_on_over_off": statistics.median(ratios), "rounds": ratios}
            )
            print(f"| {name} | {c} | {statistics.median(ratios):.3f} | {' '.join(f'{r:.3f}' for r in ratios)} |")
    print(f"lossless (every output == its path's baseline output, prompt alone; forced variants excluded): {lossless}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
