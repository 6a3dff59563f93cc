"""All-reduce latency at decode message sizes under an NCCL profile: what the GPUs take per
all-reduce, and what an engine that launches each all-reduce from Python waits.

    python -m spec_decode.probe.nccl --world-size 2 --nccl tuned            # conf/nccl/tuned.yaml
    python -m spec_decode.probe.nccl --world-size 8 --env NCCL_PROTO=LL --env NCCL_ALGO=Ring
    python -m spec_decode.probe.nccl --world-size 2 --backend gloo          # CPU (what CI tests)
    python run.py preflight.nccl_probe=true nccl=tuned hardware=h200x2 ...

Tensor-parallel decode does ~2 all-reduces per layer per token at small sizes, where latency, not
bandwidth, matters. One process per GPU (torch.distributed), the profile's variables set in those
processes only. Per size and round, two figures (docs/nccl-probe.md):

- device latency: a GPU spin (torch.cuda._sleep) is queued first, then one lead-in all-reduce that
  lines the ranks up, then N back-to-back all-reduces between two CUDA events. The host has queued
  all N before the spin ends (checked every round: the spin's event must still be pending when the
  host is done), so the figure is NCCL's time on the GPUs -- what a CUDA-graph replay pays.
- eager per-call latency: wall clock of N back-to-back eager calls / N, synchronized at both ends:
  the host path of c10d + NCCL or the device time, whichever is longer -- what an engine without
  graphs waits. With gloo the host is the device, so this is the only figure there.

Median and p90 over rounds (per round, the slowest rank). The sum is checked once per size. With
NCCL, a separate short pass under NCCL_DEBUG=INFO (never during timing: per-call log lines cost host
time) records the NCCL version, the transport between the ranks, the variables NCCL read, and its
algorithm/protocol choice per size.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from spec_decode.probe.nccl_debug import parse_nccl_debug
from spec_decode.probe.nccl_rank import rank_main

DEFAULT_SIZES = (4096, 16384, 65536, 262144, 1048576)
# INIT: version, topology and the channel/transport lines; ENV: "NCCL_X set by environment to Y";
# TUNING: "AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}" (rank 0 only);
# COLL: one line per call (opCount, count, datatype) -- cheap here, the debug pass is a few calls.
DEBUG_SUBSYS = "INIT,ENV,TUNING,COLL"
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def decode_bytes(model_dir: str | Path) -> int | None:
    """Bytes of one decode all-reduce at batch 1: hidden_size x the checkpoint's dtype (config.json);
    None when there is no config.json or no hidden_size."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        return None
    cfg = json.loads(path.read_text())
    hidden = cfg.get("hidden_size") or cfg.get("text_config", {}).get("hidden_size")
    if not hidden:
        return None
    return int(hidden) * DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2)


# ---------------------------------------------------------------------------------------------
# The rank processes


def _spawn(args: tuple, world: int, timeout_s: float, what: str) -> None:
    """Start one process per rank; kill them all and raise if they outlive timeout_s (an NCCL hang
    must not eat a GPU lease)."""
    import torch.multiprocessing as mp  # lazy: only when the probe runs (torch costs seconds)

    ctx = mp.start_processes(rank_main, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join(5)
            raise TimeoutError(
                f"nccl probe ({what}): ranks still running after {timeout_s:.0f} s, killed "
                "(a hang in NCCL? rerun with --debug-log to see how far it got)"
            )


# ---------------------------------------------------------------------------------------------
# The probe


def _summary(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs), _percentile(xs, 0.9)


def probe(
    world_size: int,
    backend: str = "gloo",
    sizes: list[int] | None = None,
    iters: int = 200,
    warmup: int = 20,
    env: dict[str, str] | None = None,
    rounds: int = 10,
    debug: bool = True,
    debug_log: str | Path | None = None,
    timeout_s: float = 300.0,
) -> dict:
    """Run the probe. Per size: eager per-call median/p90 (``median_us``/``p90_us``), with NCCL also
    the device latency (``device_median_us``/``device_p90_us`` over the rounds in which the host was
    ahead), and whether every rank saw the right sum. With NCCL and ``debug``: a short NCCL_DEBUG=INFO
    pass parsed into version, transports and algorithm/protocol per size (raw text to ``debug_log``)."""
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    env = dict(env or {})
    if iters < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"iters={iters}, rounds={rounds}, warmup={warmup}: need iters, rounds >= 1, warmup >= 0")
    out: dict = {
        "backend": backend,
        "world_size": world_size,
        "env": env,
        "iters": iters,
        "rounds": rounds,
        "method": {
            "eager": "wall clock of iters back-to-back calls / iters",
            "device": "iters all-reduces queued behind a GPU spin, CUDA events around them"
            if backend == "nccl"
            else None,
        },
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="nccl_probe_") as tmp:
        if backend == "nccl" and debug:
            dbg_env = {
                **env,
                "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS,
                "NCCL_DEBUG_FILE": str(Path(tmp) / "nccl.%h.%p.log"),
            }
            _spawn(
                (world_size, backend, sizes, iters, warmup, rounds, dbg_env, _free_port(), tmp, "debug"),
                world_size,
                timeout_s,
                "debug pass",
            )
            text = "".join(f"# {p.name}\n{p.read_text(errors='replace')}" for p in sorted(Path(tmp).glob("nccl.*.log")))
            if debug_log:
                Path(debug_log).write_text(text)
            out.update(parse_nccl_debug(text))
        # Timing without per-call log lines, unless the profile itself asks for NCCL_DEBUG.
        time_env = {"NCCL_DEBUG": "WARN", **env} if backend == "nccl" else env
        _spawn(
            (world_size, backend, sizes, iters, warmup, rounds, time_env, _free_port(), tmp, "time"),
            world_size,
            timeout_s,
            "timing",
        )
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world_size)]
    out["machine"] = ranks[0].get("meta", {})
    out["sizes"] = combine(ranks, sizes, rounds, iters, backend)
    out["correct"] = all(v["correct"] for v in out["sizes"].values())
    return out


def combine(ranks: list[dict], sizes: list[int], rounds: int, iters: int, backend: str) -> dict:
    """Per size, from every rank's per-round figures: per round the slowest rank, then median and p90
    over rounds; device figures only from rounds in which every rank's host was ahead of its GPU."""
    out = {}
    for s in map(str, sizes):
        per = [r["sizes"][s] for r in ranks]
        eager = [max(p["eager_us"][i] for p in per) for i in range(rounds)]
        rec: dict = {"iters": iters, "rounds": rounds, "correct": all(p["correct"] for p in per)}
        rec["median_us"], rec["p90_us"] = _summary(eager)
        if backend == "nccl":
            ok = [i for i in range(rounds) if all(p["host_ahead"][i] for p in per)]
            rec["device_rounds"] = len(ok)
            if ok:
                dev = [max(p["device_us"][i] for p in per) for i in ok]
                rec["device_median_us"], rec["device_p90_us"] = _summary(dev)
            else:
                rec["device_median_us"] = rec["device_p90_us"] = None
                rec["device_note"] = (
                    "the host was not done queueing before the GPU spin ended in any round "
                    "(launch queue full?): no device figure"
                )
        out[s] = rec
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(result: dict) -> str:
    """Markdown table of a probe result."""
    lines = [
        "| bytes | device median us | device p90 us | eager median us | eager p90 us | NCCL choice | correct |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, v in result["sizes"].items():
        c = result.get("choices", {}).get(s)
        choice = (
            f"{c['algorithm']}/{c['protocol']}" + (f" x{c['channels']}ch" if c.get("channels") else "") if c else "-"
        )
        lines.append(
            f"| {s} | {_fmt(v.get('device_median_us'))} | {_fmt(v.get('device_p90_us'))} | "
            f"{_fmt(v['median_us'])} | {_fmt(v['p90_us'])} | {choice} | {v['correct']} |"
        )
    return "\n".join(lines)


def profile_env(name: str, conf_dir: Path = Path("conf")) -> dict[str, str]:
    """The variables of an NCCL profile (conf/nccl/<name>.yaml: ``env``), as strings."""
    path = Path(conf_dir) / "nccl" / f"{name}.yaml"
    if not path.exists():
        opts = sorted(p.stem for p in (Path(conf_dir) / "nccl").glob("*.yaml"))
        raise ValueError(
            f"--nccl {name}: no {path} (profiles there: {', '.join(opts) or 'none'}; "
            "--conf-dir points at the conf/ folder)"
        )
    return {k: str(v) for k, v in (yaml.safe_load(path.read_text()).get("env") or {}).items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.probe.nccl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl if CUDA, else gloo")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes, comma-separated")
    ap.add_argument("--model-path", default=None, help="add this model's decode all-reduce size (config.json)")
    ap.add_argument("--iters", type=int, default=200, help="back-to-back all-reduces per round")
    ap.add_argument("--rounds", type=int, default=10, help="rounds per size: median and p90 are over these")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--nccl", default=None, metavar="PROFILE", help="an NCCL profile of conf/nccl/ (e.g. tuned)")
    ap.add_argument("--conf-dir", type=Path, default=Path("conf"))
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="NCCL variable (repeat)")
    ap.add_argument("--no-debug", action="store_true", help="skip the NCCL_DEBUG=INFO pass")
    ap.add_argument("--debug-log", type=Path, default=None, help="save the raw NCCL_DEBUG=INFO text here")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per pass; the ranks are killed after it")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    bad = [kv for kv in args.env if "=" not in kv or not kv.startswith("NCCL_")]
    if bad:
        ap.error(f"--env {bad[0]}: expected NCCL_NAME=VALUE")
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--sizes {args.sizes}: expected bytes, comma-separated (e.g. 4096,65536)")
    if args.model_path:
        b = decode_bytes(args.model_path)
        if b is None:
            ap.error(f"--model-path {args.model_path}: no config.json with hidden_size there")
        sizes.append(b)
    import torch  # lazy: torch costs seconds of start-up; --help and the argument errors above never pay it

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and torch.cuda.device_count() < args.world_size:
        ap.error(f"--world-size {args.world_size}: only {torch.cuda.device_count()} GPU(s) visible")
    try:
        env = profile_env(args.nccl, args.conf_dir) if args.nccl else {}
    except ValueError as e:
        ap.error(str(e))
    env.update(dict(kv.split("=", 1) for kv in args.env))
    res = probe(
        args.world_size,
        backend,
        sizes,
        args.iters,
        args.warmup,
        env,
        rounds=args.rounds,
        debug=not args.no_debug,
        debug_log=args.debug_log,
        timeout_s=args.timeout_s,
    )
    res["profile"] = args.nccl
    m = res.get("machine", {})
    print(
        f"backend={backend} world_size={args.world_size} profile={args.nccl or '-'} env={env or '{}'}\n"
        f"NCCL_* in the ranks: {m.get('nccl_env', {})}\n"
        f"nccl={res.get('nccl_version') or m.get('torch_nccl_version')} gpu={m.get('gpu')} "
        f"p2p_access={m.get('p2p_access')} transports={res.get('transports')} "
        f"algo={res.get('algorithms')} proto={res.get('protocols')} "
        f"iters={args.iters} rounds={args.rounds}"
    )
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
