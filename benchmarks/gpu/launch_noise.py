"""Launch-to-launch noise of the embedded engine on one GPU, its ranks free or pinned to fixed cores
(issue 41: the one-GPU block design's launches differ by 4-9% while each launch's runs agree to ~1%).

    timeout 300 python benchmarks/gpu/launch_noise.py --launches 5 --pin 2,3
    python benchmarks/gpu/launch_noise.py --device cpu --launches 2 --tokens 64 --pin 0   # a CPU check

The tiny model decodes in well under a millisecond a token on an H200, so a launch's speed is its host
loop's: which cores the rank's Python thread gets on the VM. Each launch starts a baseline and a steps-3
rank group (the server's own processes, ``ranks.RankGroup``, no HTTP) in one of two arms, interleaved
launch by launch (the arm order alternating):

- ``free``: the kernel places every thread (the runner's default);
- ``pinned``: every thread of both groups' rank processes on the ``--pin`` cores, this process (the
  client) on the others: the same cores for every launch.

Each launch: one warmup request per group, then ``--runs`` requests of ``--tokens`` tokens alternating
baseline and spec. Per launch: the median tok/s of each group and the median of per-run ratios. Per arm:
the CV across launches (the noise a block design's interval holds) of the baseline, the spec group and
the ratio, against the median within-launch CV. Prints a table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from spec_decode.analysis.stats import summarize
from spec_decode.engines.embedded.ranks import RankGroup
from spec_decode.engines.embedded.scheduler import RankSpec
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.runner.pairing import pin_tree

ROOT = Path(__file__).resolve().parents[2]


def group(args, steps: int) -> RankGroup:
    spec = RankSpec(
        model_path=str(ROOT / "models/tiny/target"),
        draft_model_path=str(ROOT / "models/tiny/drafter") if steps else None,
        steps=steps,
        tp_size=1,
        device=args.device,
        cpu_threads=1,
        random_seed=0,
        decode_log_interval=10**9,
        log_level="warning",
        dist_port=0,
        front_pid=0,
        max_running_requests=1,
        disable_overlap_schedule=args.overlap_off,
        cuda_eager_batching=False,
        static_path=False,
        cuda_graph_max_bs=1,
    )
    return RankGroup(spec)


def last_cpu(pid: int) -> int:
    """The core a process last ran on (/proc/PID/stat, field 39)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[36])


def cv(xs: list[float]) -> float:
    """The coefficient of variation in % (stats.summarize's; 0 for one value)."""
    return 100 * summarize(xs).cv


def one_launch(args, arm: str, prompt: list[int], all_cores: set[int], pin: set[int]) -> dict:
    os.sched_setaffinity(0, all_cores)
    groups = {"base": group(args, 0), "spec": group(args, 3)}
    try:
        pids = [p.pid for g in groups.values() for p in g.procs]
        # pin_tree pins a process and its children: this process's tree first (the client), then the ranks
        pin_tree(os.getpid(), all_cores - pin if arm == "pinned" else all_cores)
        if arm == "pinned":
            for pid in pids:
                pin_tree(pid, pin)
        for g in groups.values():  # warmup
            g.call("generate", prompt, args.tokens, False)
        rates: dict[str, list[float]] = {"base": [], "spec": []}
        for r in range(args.runs):
            for name in ("base", "spec") if r % 2 == 0 else ("spec", "base"):
                t0 = time.perf_counter()
                out = groups[name].call("generate", prompt, args.tokens, False)["generation"]["output_ids"]
                rates[name].append(len(out) / (time.perf_counter() - t0))
        cpus = sorted({last_cpu(p) for p in pids})
    finally:
        for g in groups.values():
            g.close()
        os.sched_setaffinity(0, all_cores)
    ratios = [s / b for s, b in zip(rates["spec"], rates["base"])]
    return {
        "arm": arm,
        "base_tok_s": statistics.median(rates["base"]),
        "spec_tok_s": statistics.median(rates["spec"]),
        "ratio": statistics.median(ratios),
        "within_cv_base": cv(rates["base"]),
        "within_cv_spec": cv(rates["spec"]),
        "rank_cpus": cpus,
        "runs": rates,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--launches", type=int, default=5, help="launches per arm")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--pin", default="2,3", help="the cores of the pinned arm's rank processes")
    ap.add_argument("--overlap-off", action="store_true", help="--disable-overlap-schedule in both groups")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    all_cores = set(os.sched_getaffinity(0))
    pin = {int(x) for x in args.pin.split(",")}
    if not pin < all_cores:
        ap.error(f"--pin {args.pin}: must be a proper subset of this process's cores {sorted(all_cores)}")
    text = json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"]
    prompt = encode(text)
    rows = []
    for i in range(args.launches):
        for arm in ("free", "pinned") if i % 2 == 0 else ("pinned", "free"):
            row = one_launch(args, arm, prompt, all_cores, pin)
            row["launch"] = i
            rows.append(row)
            print(
                f"launch {i} {arm:6s} base {row['base_tok_s']:7.1f} spec {row['spec_tok_s']:7.1f} tok/s "
                f"ratio {row['ratio']:.3f} (within-launch CV {row['within_cv_base']:.1f}% / "
                f"{row['within_cv_spec']:.1f}%; ranks last on cpus {row['rank_cpus']})",
                flush=True,
            )
    print(
        f"\ndevice={args.device} cpus={os.cpu_count()} pin={sorted(pin)} tokens={args.tokens} runs={args.runs} "
        f"overlap={'off' if args.overlap_off else 'on'} loadavg={open('/proc/loadavg').read().split()[:3]}"
    )
    print(
        "| arm | launches | baseline tok/s (median) | CV across launches: baseline | spec | ratio | "
        "median ratio | median within-launch CV (base / spec) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arm in ("free", "pinned"):
        rs = [r for r in rows if r["arm"] == arm]
        print(
            f"| {arm} | {len(rs)} | {statistics.median(r['base_tok_s'] for r in rs):.0f} | "
            f"{cv([r['base_tok_s'] for r in rs]):.1f}% | {cv([r['spec_tok_s'] for r in rs]):.1f}% | "
            f"{cv([r['ratio'] for r in rs]):.1f}% | {statistics.median(r['ratio'] for r in rs):.3f} | "
            f"{statistics.median(r['within_cv_base'] for r in rs):.1f}% / "
            f"{statistics.median(r['within_cv_spec'] for r in rs):.1f}% |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
