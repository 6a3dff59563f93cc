"""All-reduce latency at decode message sizes under an NCCL profile, before a sweep starts.

    python -m spec_decode.nccl_probe --world-size 8 --backend nccl --env NCCL_PROTO=LL --env NCCL_ALGO=Ring
    python -m spec_decode.nccl_probe --world-size 2 --backend gloo          # CPU (what CI tests)
    python run.py preflight.nccl_probe=true nccl=tuned hardware=rtx_pro_6000x8 engine=sglang ...

Tensor-parallel decode does ~2 all-reduces per layer per token at small sizes, where NCCL's latency,
not its bandwidth, matters. One process per GPU (torch.distributed), the profile's variables set in
those processes only; per size: warmup, then many timed all-reduces (CUDA events on GPUs, resolved
after the loop; host clock with gloo); median and p90 in microseconds; the result of the all-reduce is
checked. With NCCL, NCCL_DEBUG=INFO goes to a file and the NCCL version and the algorithm/protocol
NCCL reports are parsed from it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import tempfile
from pathlib import Path

DEFAULT_SIZES = (4096, 16384, 65536, 262144, 1048576)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _rank_main(rank: int, world: int, backend: str, sizes: list[int], iters: int, warmup: int,
               env: dict[str, str], port: int, out_dir: str) -> None:
    os.environ.update(env)  # the profile's variables: in the probe's processes only
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import time

    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    results = {}
    expected = world * (world + 1) / 2
    for size in sizes:
        n = max(1, size // torch.tensor([], dtype=dtype).element_size())
        x = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
        for _ in range(warmup):
            y = x.clone()
            dist.all_reduce(y)
        times: list[float] = []
        if cuda:
            events = []
            for _ in range(iters):
                y = x.clone()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dist.all_reduce(y)
                b.record()
                events.append((a, b))
            torch.cuda.synchronize()  # resolved after the loop, never inside it
            times = [a.elapsed_time(b) * 1e3 for a, b in events]
        else:
            for _ in range(iters):
                y = x.clone()
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(y)
                times.append((time.perf_counter() - t0) * 1e6)
        ok = bool(torch.all(y.float() == expected).item())
        results[str(size)] = {"median_us": statistics.median(times), "p90_us": _percentile(times, 0.9),
                              "iters": iters, "correct": ok}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")  # NCCL's ids
PROTOS = ("LL", "LL128", "Simple")


def parse_nccl_debug(text: str) -> dict:
    """NCCL version and the algorithm/protocol choices NCCL_DEBUG=INFO reports for all-reduce: both the
    named form ("... Ring/LL ...") and the tuning form ("4096 Bytes -> Algo 1 proto 0 ...")."""
    version = re.search(r"NCCL version ([\w.+\-]+)", text)
    algos, protos, evidence = set(), set(), []
    for line in text.splitlines():
        m = re.search(r"(\d+) Bytes -> Algo (\d+) proto (\d+)", line)
        if m:
            a, p = int(m.group(2)), int(m.group(3))
            algos.add(ALGOS[a] if a < len(ALGOS) else f"algo{a}")
            protos.add(PROTOS[p] if p < len(PROTOS) else f"proto{p}")
            evidence.append(line.strip())
            continue
        if "allreduce" not in line.lower():
            continue
        named_a = set(re.findall(r"\b(Ring|Tree|CollNetDirect|CollNetChain|NVLS|NVLSTree|PAT)\b", line))
        named_p = set(re.findall(r"\b(LL128|LL|Simple)\b", line))
        if named_a or named_p:
            algos |= named_a
            protos |= named_p
            evidence.append(line.strip())
    return {"nccl_version": version.group(1) if version else None, "algorithms": sorted(algos),
            "protocols": sorted(protos), "nccl_debug_evidence": evidence[:20]}


def probe(world_size: int, backend: str = "gloo", sizes: list[int] | None = None, iters: int = 200,
          warmup: int = 20, env: dict[str, str] | None = None) -> dict:
    """Run the probe; returns per size the median/p90 over ranks (the slowest rank's median), whether
    every rank saw the right sum, and (NCCL) version and chosen algorithm/protocol."""
    import torch.multiprocessing as mp

    sizes = sorted(set(sizes or DEFAULT_SIZES))
    env = dict(env or {})
    with tempfile.TemporaryDirectory(prefix="nccl_probe_") as tmp:
        if backend == "nccl":
            env.setdefault("NCCL_DEBUG", "INFO")
            env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,TUNING,COLL")
            env.setdefault("NCCL_DEBUG_FILE", str(Path(tmp) / "nccl.%h.%p.log"))
        mp.spawn(_rank_main, args=(world_size, backend, sizes, iters, warmup, env, _free_port(), tmp),
                 nprocs=world_size, join=True)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world_size)]
        debug = "".join(p.read_text(errors="replace") for p in Path(tmp).glob("nccl.*.log"))
    out = {"backend": backend, "world_size": world_size, "env": env, "sizes": {}}
    for s in map(str, sizes):
        out["sizes"][s] = {
            "median_us": max(r[s]["median_us"] for r in ranks),
            "p90_us": max(r[s]["p90_us"] for r in ranks),
            "correct": all(r[s]["correct"] for r in ranks),
            "iters": iters,
        }
    out["correct"] = all(v["correct"] for v in out["sizes"].values())
    if backend == "nccl":
        out.update(parse_nccl_debug(debug))
    return out


def metrics_of(result: dict) -> dict[str, float]:
    return {f"nccl_allreduce_us_{s}": v["median_us"] for s, v in result["sizes"].items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_decode.nccl_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl if CUDA, else gloo")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="NCCL variable (repeat)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and torch.cuda.device_count() < args.world_size:
        ap.error(f"--world-size {args.world_size}: only {torch.cuda.device_count()} GPU(s) visible")
    env = dict(kv.split("=", 1) for kv in args.env)
    res = probe(args.world_size, backend, [int(x) for x in args.sizes.split(",")], args.iters, args.warmup, env)
    print(f"backend={backend} world_size={args.world_size} env={env or '{}'} "
          f"nccl={res.get('nccl_version')} algo={res.get('algorithms')} proto={res.get('protocols')}")
    print("| bytes | median us | p90 us | correct |")
    print("|---|---|---|---|")
    for s, v in res["sizes"].items():
        print(f"| {s} | {v['median_us']:.1f} | {v['p90_us']:.1f} | {v['correct']} |")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
