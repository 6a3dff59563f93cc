"""What runs in each rank process of the NCCL probe (spec_decode.probe.nccl): the profile's variables set,
the process group made, then per size the eager and device all-reduce latency (a GPU spin queued first,
so the host has queued all N before the GPU starts), the sum checked, and the rank's file written."""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


DEBUG_CALLS = 2  # all-reduces per size in the debug pass: the choice is per size, one line per call


SPIN_MARGIN = 3.0  # spin = this x the median eager time of a round + SPIN_EXTRA_US: the host must be done first


SPIN_EXTRA_US = 2000.0


def spin_cycles_per_us(torch) -> float:
    """GPU clock cycles per microsecond of torch.cuda._sleep, measured (clocks ramp under load)."""
    torch.cuda._sleep(1_000_000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return 1e7 / (a.elapsed_time(b) * 1e3)


def time_size(torch, dist, cuda: bool, y, iters: int, warmup: int, rounds: int, cycles_per_us: float) -> dict:
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(y)
    sync()
    eager: list[float] = []
    for _ in range(rounds):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(y)
        sync()
        eager.append((time.perf_counter() - t0) * 1e6 / iters)
    device: list[float] = []
    host_ahead: list[bool] = []
    if cuda:
        spin_cycles = int((SPIN_MARGIN * iters * statistics.median(eager) + SPIN_EXTRA_US) * cycles_per_us)
        for _ in range(rounds):
            spun, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            sync()
            torch.cuda._sleep(spin_cycles)
            spun.record()
            dist.all_reduce(y)  # lead-in: both ranks leave it together, so the timed batch starts aligned
            start.record()
            for _ in range(iters):
                dist.all_reduce(y)
            end.record()
            host_ahead.append(not spun.query())  # GPU still spinning: all N were queued in time
            end.synchronize()
            device.append(start.elapsed_time(end) * 1e3 / iters)
    return {"eager_us": eager, "device_us": device, "host_ahead": host_ahead}


def rank_main(
    rank: int,
    world: int,
    backend: str,
    sizes: list[int],
    iters: int,
    warmup: int,
    rounds: int,
    env: dict[str, str],
    port: int,
    out_dir: str,
    mode: str,
) -> None:
    os.environ.update(env)  # the profile's variables: in the probe's processes only
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch  # lazy: a rank process only; importing torch costs seconds where the probe is not run
    import torch.distributed as dist

    cuda = backend == "nccl"
    kwargs = {}
    if cuda:
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)  # communicator made now, not at the 1st call
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=120), **kwargs)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    out: dict = {"sizes": {}}
    try:
        cycles_per_us = spin_cycles_per_us(torch) if cuda and mode == "time" else 0.0
        for size in sizes:
            n = max(1, size // elem)
            if mode == "debug":  # NCCL logs its choice per call; a couple of calls per size suffice
                y = torch.zeros(n, dtype=dtype, device=device)
                for _ in range(DEBUG_CALLS):
                    dist.all_reduce(y)
                continue
            y = torch.zeros(n, dtype=dtype, device=device)  # zeros: the sum stays finite over any N
            rec = time_size(torch, dist, cuda, y, iters, warmup, rounds, cycles_per_us)
            x = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
            dist.all_reduce(x)
            rec["correct"] = bool(torch.all(x.float() == world * (world + 1) / 2).item())
            out["sizes"][str(size)] = rec
        if cuda:
            torch.cuda.synchronize()
            nccl_v = torch.cuda.nccl.version()
            out["meta"] = {
                "torch_nccl_version": ".".join(map(str, nccl_v)) if isinstance(nccl_v, tuple) else str(nccl_v),
                "gpu": torch.cuda.get_device_name(rank),
                "p2p_access": [torch.cuda.can_device_access_peer(rank, p) for p in range(world) if p != rank],
                "spin_cycles_per_us": cycles_per_us,
            }
        else:
            out["meta"] = {}
        out["meta"]["nccl_env"] = {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and k not in DEBUG_VARS
        }
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
