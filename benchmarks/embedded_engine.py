"""Embedded engine: baseline vs EAGLE-3 steps, at one or more tp sizes, interleaved.

    python benchmarks/embedded_engine.py                          # CPU, tp 1: baseline, steps 1,2,3,5
    python benchmarks/embedded_engine.py --tp-size 1,2 --steps 3  # tp 1 vs tp 2 (gloo all-reduces)
    python benchmarks/embedded_engine.py --device cuda            # GPU: CUDA graphs vs eager, fp32
    python benchmarks/embedded_engine.py --device cuda --disable-cuda-graph   # GPU, eager only

Every variant is a real rank group (the server's own processes, ``ranks.RankGroup``: one spawned
process per rank, no HTTP), all started first and then timed in rounds (ABCD ABCD ...), so machine
noise hits all of them alike. The table gives tok/s medians over rounds, the speedup as the median of
per-round ratios against the baseline of the same tp size, and the phase split (ms per cycle) of
rank 0 as the profiler plugin measured it (SPEC_DECODE_PROFILE, the same plugin SGLang loads), over
the timed rounds only. "lossless" compares each variant's output with tp 1's baseline (of the same
mode on CUDA: graph replays must equal eager token for token). On CUDA every variant runs twice, with
CUDA graphs and eagerly (the same static-shape kernels, ``--disable-cuda-graph``), and a second table
gives graph/eager per variant. Bound it with ``timeout`` on a GPU box.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from spec_decode.engines.embedded.ranks import RankGroup
from spec_decode.engines.embedded.scheduler import RankSpec
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.parsers.profile import in_windows, phase_summary, rank_path, read_profile

ROOT = Path(__file__).resolve().parents[1]


def start(args, tp: int, steps: int, graph: bool, profile: Path) -> RankGroup:
    os.environ["SPEC_DECODE_PROFILE"] = str(profile)  # inherited by the ranks spawned next
    spec = RankSpec(
        model_path=str(ROOT / "models/tiny/target"),
        draft_model_path=args.drafter if steps else None,
        steps=steps,
        tp_size=tp,
        device=args.device,
        cpu_threads=args.threads,
        random_seed=0,
        decode_log_interval=10**9,
        log_level="warning",
        dist_port=0,
        front_pid=0,
        disable_cuda_graph=not graph,
    )
    return RankGroup(spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--disable-cuda-graph", action="store_true", help="CUDA: eager variants only")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--tp-size", default="1", help="comma-separated tp sizes")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", default="1,2,3,5")
    ap.add_argument("--drafter", default=str(ROOT / "models/tiny/drafter"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    prompt = encode(json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"])
    tmp = Path(tempfile.mkdtemp(prefix="embedded_bench_"))
    modes = [False] if args.device != "cuda" or args.disable_cuda_graph else [True, False]
    variants: dict[str, tuple[int, int, RankGroup, Path]] = {}
    baselines: dict[str, str] = {}
    try:
        for graph in modes:
            suffix = (" graph" if graph else " eager") if args.device == "cuda" else ""
            for tp in (int(x) for x in args.tp_size.split(",")):
                for steps in [0, *(int(k) for k in args.steps.split(","))]:
                    name = f"tp={tp} " + (f"steps={steps}" if steps else "baseline") + suffix
                    profile = tmp / f"{name.replace(' ', '_').replace('=', '')}.jsonl"
                    variants[name] = (tp, steps, start(args, tp, steps, graph, profile), profile)
                    baselines[name] = f"tp={tp} baseline{suffix}"
        for _, _, group, _ in variants.values():  # warmup
            group.call("generate", prompt, 64)
        tps: dict[str, list[float]] = {k: [] for k in variants}
        windows: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        last: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, (_, _, group, _) in variants.items():
                t0, w0 = time.perf_counter(), time.time()
                out = group.call("generate", prompt, args.tokens)
                tps[name].append(args.tokens / (time.perf_counter() - t0))
                windows[name].append((w0, time.time()))
                last[name] = out["generation"]
    finally:
        for _, _, group, _ in variants.values():
            group.close()  # the ranks exit normally: the profiler drains every cycle to its file
    first_tp = int(args.tp_size.split(",")[0])
    refs = {
        name: last[base.replace(base.split(" ")[0], f"tp={first_tp}", 1)]["output_ids"]
        for name, base in baselines.items()
    }  # the first tp size's baseline, same mode
    print(
        f"device={args.device} threads/rank={args.threads} tokens={args.tokens} rounds={args.rounds} "
        f"torch={torch.__version__} cpus={os.cpu_count()}"
    )
    print(
        "| variant | tok/s (median) | speedup vs same-tp baseline | accept len | draft accept rate | "
        "cycle ms | draft ms | verify ms | re-extend ms | other ms | lossless |"
    )
    print("|---" * 11 + "|")
    rows = []
    for name, (tp, steps, _, profile) in variants.items():
        base = tps[baselines[name]]
        gen = last[name]
        row = {
            "variant": name,
            "tp": tp,
            "steps": steps,
            "tok_s": statistics.median(tps[name]),
            "speedup": statistics.median(v / b for v, b in zip(tps[name], base)),
            "lossless": gen["output_ids"] == refs[name],
        }
        if steps:
            cycles = [c for w in in_windows(read_profile(Path(rank_path(profile, 0))), windows[name]) for c in w]
            phases = phase_summary(cycles) or {}
            row |= {
                "accept_len": len(gen["output_ids"]) / gen["verify_ct"],
                "accept_rate": gen["correct_drafts"] / gen["proposed_drafts"],
                **{f"{p}_ms": phases.get(f"{p}_ms") for p in ("cycle", "draft", "verify", "extend", "other")},
            }
        rows.append(row)

        def f(k, row=row):
            return format(row[k], ".2f") if row.get(k) is not None else "-"

        print(
            f"| {name} | {row['tok_s']:.0f} | {row['speedup']:.2f}x | {f('accept_len')} | {f('accept_rate')} | "
            f"{f('cycle_ms')} | {f('draft_ms')} | {f('verify_ms')} | {f('extend_ms')} | {f('other_ms')} | "
            f"{row['lossless']} |"
        )
    if len(modes) == 2:
        print(
            "\n| variant | graph tok/s | eager tok/s | graph / eager (median of per-round ratios) | "
            "graph output == eager |"
        )
        print("|---|---|---|---|---|")
        for name in variants:
            if name.endswith(" graph"):
                eager = name[: -len(" graph")] + " eager"
                ratio = statistics.median(g / e for g, e in zip(tps[name], tps[eager]))
                same = last[name]["output_ids"] == last[eager]["output_ids"]
                print(
                    f"| {name[: -len(' graph')]} | {statistics.median(tps[name]):.0f} | "
                    f"{statistics.median(tps[eager]):.0f} | {ratio:.2f}x | {same} |"
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
