"""Does streaming slow the embedded engine? One server, requests alternating non-stream / stream.

    python benchmarks/streaming_overhead.py [--rounds 10] [--tokens 500] [--steps 3] [--tp-size 1]

Prints per-mode medians of the client's tok/s (request sent -> answer / [DONE] read) and of the
server's e2e_latency, and the median per-pair ratio stream / non-stream with its spread. Pair i runs
stream first when i is odd, so drift on the host hits both modes alike. Results: docs/embedded-engine.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from spec_decode.engines.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The old robot sleeps in the garden. "


def one(url: str, tokens: int, stream: bool) -> tuple[float, float, int]:
    """(client tok/s, server e2e_latency s, events) of one request."""
    body = {
        "text": PROMPT,
        "stream": stream,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
    }
    t0 = time.perf_counter()
    r = requests.post(url, json=body, timeout=300, stream=stream)
    if stream:
        events = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
        wall = time.perf_counter() - t0
        assert events[-1] == b"[DONE]"
        last = json.loads(events[-2])
        n_events = len(events) - 1
    else:
        last = r.json()
        wall = time.perf_counter() - t0
        n_events = 1
    meta = last["meta_info"]
    assert meta["completion_tokens"] == tokens
    return tokens / wall, meta["e2e_latency"], n_events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tp-size", type=int, default=1)
    args = ap.parse_args()
    port = free_port()
    spec = (
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(ROOT / "models/tiny/drafter"),
            "--speculative-num-steps",
            str(args.steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(args.steps + 1),
        ]
        if args.steps
        else []
    )
    argv = [
        sys.executable,
        "-m",
        "spec_decode.engines.embedded",
        "--model-path",
        str(ROOT / "models/tiny/target"),
        *spec,
        "--port",
        str(port),
        "--tp-size",
        str(args.tp_size),
        "--random-seed",
        "0",
    ]
    rows: dict[bool, list] = {False: [], True: []}
    with (
        tempfile.TemporaryDirectory() as d,
        ServerProcess(
            argv, env={}, log_path=Path(d) / "server.log", host="127.0.0.1", port=port, startup_timeout_s=180
        ) as srv,
    ):
        url = srv.base_url + "/generate"
        one(url, args.tokens, False)  # warm both paths
        one(url, args.tokens, True)
        for i in range(args.rounds):
            for stream in (True, False) if i % 2 else (False, True):
                rows[stream].append(one(url, args.tokens, stream))
    ratios = [s[0] / n[0] for s, n in zip(rows[True], rows[False])]
    e2e_ratios = [s[1] / n[1] for s, n in zip(rows[True], rows[False])]
    print(f"embedded engine, steps={args.steps}, tp={args.tp_size}, {args.tokens} tokens, {args.rounds} pairs")
    print(f"{'mode':<11}{'tok/s (client) median':>24}{'e2e_latency s median':>24}{'events median':>16}")
    for stream in (False, True):
        r = rows[stream]
        print(
            f"{'stream' if stream else 'non-stream':<11}{statistics.median(x[0] for x in r):>24.1f}"
            f"{statistics.median(x[1] for x in r):>24.4f}{statistics.median(x[2] for x in r):>16.0f}"
        )
    q = statistics.quantiles(ratios, n=4)
    print(
        f"stream / non-stream tok/s per pair: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}, "
        f"{q[2]:.3f}); server e2e_latency ratio median {statistics.median(e2e_ratios):.3f}"
    )


if __name__ == "__main__":
    main()
