"""The embedded server's CPU per streamed token, process by process, for two code trees side by side.

    python benchmarks/server_cpu.py --roots /tmp/before,. --concurrency 16 --rounds 6
    python benchmarks/server_cpu.py --roots . --no-stream                     # one tree, unstreamed

Starts one embedded server (CPU, tiny target; ``--spec``: EAGLE-3 steps 3 with the tiny drafter) from
each tree (``PYTHONPATH`` and the working directory set to it), all up at once, then per round drives each
in turn (ABBA order from round to round, the others idle): ``--concurrency`` closed-loop clients send
``--requests`` requests of ``--tokens`` greedy tokens (streamed unless ``--no-stream``), and around the
load the server's process tree is read (``runner.machine.tree_sample``: what the runner records per
launch). Per tree: tok/s, and each process's CPU ms per 1k tokens (the launcher is the HTTP front, rank0
decodes); medians over the rounds and, for two trees, the ratio of each round's figures (second / first),
median and range. CPU time per token, not wall time, is what this compares: on a shared 2-core machine
the wall clock moves with the neighbours' load, a process's CPU per token much less.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spec_decode.engines.server_process import free_port  # noqa: E402
from spec_decode.runner import machine  # noqa: E402

PROMPTS = [f"def f{i}(x):\n    # return the {i}-th value\n    return" for i in range(16)]


def start(root: Path, spec: bool, conc: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "spec_decode.engines.embedded", "--model-path", "models/tiny/target"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--random-seed", "0", "--device", "cpu"]
    argv += ["--max-running-requests", str(conc), "--cpu-threads", "1"]
    if spec:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "models/tiny/drafter"]
        argv += ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if requests.get(url + "/health", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server from {root} exited with {proc.returncode} before it was healthy")
        time.sleep(0.1)
    raise SystemExit(f"the server from {root} was not healthy in 60 s")


def load(url: str, conc: int, n: int, tokens: int, stream: bool) -> int:
    """``n`` requests over ``conc`` closed-loop clients; the completion tokens they got."""
    left, got, lock = [n], [0], threading.Lock()

    def client(k: int) -> None:
        s = requests.Session()
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
                i = left[0]
            body = {
                "text": PROMPTS[(i + k) % len(PROMPTS)],
                "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
                "stream": stream,
            }
            r = s.post(url + "/generate", json=body, stream=stream, timeout=300)
            r.raise_for_status()
            last = None
            if stream:
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        last = line
                if last is None:
                    raise RuntimeError(f"{url}: a streamed request ended without a data event")
                done = requests.models.complexjson.loads(last[6:])
            else:
                done = r.json()
            with lock:
                got[0] += done["meta_info"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got[0]


def measure(proc: subprocess.Popen, url: str, args) -> dict:
    a = machine.tree_sample(proc.pid)
    t0 = time.perf_counter()
    tokens = load(url, args.concurrency, args.requests, args.tokens, not args.no_stream)
    wall = time.perf_counter() - t0
    if tokens == 0:
        raise SystemExit(f"{url}: no completion tokens in a round")
    procs = machine.tree_window(a, machine.tree_sample(proc.pid))
    out = {"tok_s": tokens / wall}
    for p in procs:
        out[p.name] = out.get(p.name, 0.0) + 1e6 * p.cpu_s / tokens
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--roots", default=".", help="comma-separated code trees (git worktrees), first = reference")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64, help="requests per round and tree")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--spec", action="store_true", help="EAGLE-3, steps 3 (default: no speculation)")
    ap.add_argument("--no-stream", action="store_true")
    args = ap.parse_args(argv)
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    servers = [start(r, args.spec, args.concurrency) for r in roots]
    rows: list[list[dict]] = [[] for _ in roots]
    try:
        for _proc, url in servers:  # warm each (its first batches, the client's imports)
            load(url, args.concurrency, args.concurrency, 8, not args.no_stream)
        for k in range(args.rounds):
            order = list(range(len(roots)))
            if k % 2:
                order.reverse()
            for i in order:
                rows[i].append(measure(*servers[i], args))
            print(
                f"round {k + 1}: " + "; ".join(f"{roots[i].name or roots[i]}: {fmt(rows[i][-1])}" for i in order),
                flush=True,
            )
    finally:
        for proc, _ in servers:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    keys = ["tok_s", *sorted({k for rs in rows for r in rs for k in r} - {"tok_s"})]
    what = f"{'spec steps 3' if args.spec else 'baseline'}, concurrency {args.concurrency}, {args.tokens} tokens, "
    what += f"{'unstreamed' if args.no_stream else 'streamed'}, {args.rounds} rounds (medians; CPU in ms per 1k tokens)"
    print(f"\n{what}\n")
    print("| tree | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for root, rs in zip(roots, rows):
        print(f"| {root} | " + " | ".join(f"{statistics.median(r.get(k, 0.0) for r in rs):.1f}" for k in keys) + " |")
    if len(roots) == 2:
        print("\nsecond / first, per round (median [min, max]):")
        for k in keys:
            ratios = [b.get(k, 0.0) / a[k] for a, b in zip(*rows) if a.get(k)]
            if ratios:
                print(f"  {k}: {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    return 0


def fmt(r: dict) -> str:
    return f"{r['tok_s']:.0f} tok/s, " + ", ".join(f"{k} {v:.0f}" for k, v in r.items() if k != "tok_s")


if __name__ == "__main__":
    sys.exit(main())
