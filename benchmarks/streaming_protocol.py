"""Does streaming change the timed throughput? stream=true vs stream=false, interleaved on one server.

    python benchmarks/streaming_protocol.py                    # embedded engine, steps 3, 10 pairs x 500 tokens
    python benchmarks/streaming_protocol.py --pairs 20 --steps 0 --tokens 200

One embedded server (tp 1, 1 CPU thread), 1 warmup of each mode, then --pairs pairs of back-to-back
requests of the same prompt, pair i stream-first when i is even (an order effect cancels). Throughput is
the protocol's: completion_tokens / client wall time (send -> last byte / [DONE]). Printed: per mode the
median and CV of tok/s; the per-pair ratio stream / non-stream (median, geometric mean with a 95% t-CI:
streaming costs nothing measurable when the CI holds 1.0); the CPU time per request of the client
process and of the server's HTTP front process (the rank process decodes; with streaming the front
encodes one event per verify cycle, the client parses it) -- a cost that the machine's load does not
blur the way it blurs tok/s; the streamed runs' TTFT / ITL / TPOT.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spec_decode.analysis import latency, stats  # noqa: E402
from spec_decode.core.prompts import load_prompts  # noqa: E402
from spec_decode.engines.server_process import ServerProcess, free_port  # noqa: E402
from spec_decode.runner.client import Client  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", type=int, default=3, help="draft steps; 0 = no speculation (baseline)")
    args = ap.parse_args()
    argv = [
        sys.executable,
        "-m",
        "spec_decode.engines.embedded",
        "--model-path",
        str(ROOT / "models/tiny/target"),
        "--cpu-threads",
        "1",
    ]
    if args.steps:
        argv += [
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
    port = free_port()
    log = Path(f"/tmp/streaming_overhead.{port}.log")
    prompt = load_prompts(ROOT / "data/prompts.jsonl")[0]
    with ServerProcess(
        argv + ["--port", str(port)], env={}, log_path=log, host="127.0.0.1", port=port, startup_timeout_s=120
    ) as srv:
        client = Client(srv.base_url, 120)
        body = client.generate_body(prompt, args.tokens, 0.0, True)
        client.generate(body, 0, -1)
        client.generate(body, 0, -1, stream=True)
        front = psutil.Process(srv.pid)
        runs: dict[bool, list] = {True: [], False: []}
        cpu: dict[bool, dict[str, list[float]]] = {m: {"client": [], "front": []} for m in (True, False)}
        for i in range(args.pairs):
            for mode in (True, False) if i % 2 == 0 else (False, True):
                c0, f0 = time.process_time(), sum(front.cpu_times()[:2])
                runs[mode].append(client.generate(body, 0, i, stream=mode))
                cpu[mode]["client"].append(time.process_time() - c0)
                cpu[mode]["front"].append(sum(front.cpu_times()[:2]) - f0)
    tput = {m: [r.throughput_tok_s for r in rs] for m, rs in runs.items()}
    ratio = stats.paired_ratio(tput[True], tput[False])
    per_pair = [a / b for a, b in zip(tput[True], tput[False])]
    what = f"steps={args.steps}" if args.steps else "no speculation"
    print(
        f"embedded engine, {what}, {args.tokens} tokens, {args.pairs} interleaved pairs (tok/s = completion / client wall)\n"
    )
    print("| mode | n | tok/s median | tok/s mean | CV |")
    print("|---|---|---|---|---|")
    for m in (False, True):
        s = stats.summarize(tput[m])
        print(f"| {'stream' if m else 'non-stream'} | {s.n} | {s.median:.1f} | {s.mean:.1f} | {100 * s.cv:.1f}% |")
    print(
        f"\nstream / non-stream per pair: median {statistics.median(per_pair):.4f}, geometric mean "
        f"{ratio.ratio:.4f} [95% CI {ratio.ci95_lo:.4f}, {ratio.ci95_hi:.4f}]"
        f"{' (differs from 1)' if ratio.significant else ' (CI holds 1.0: no measurable difference)'}"
    )
    print("\n| CPU ms per request (median) | non-stream | stream |")
    print("|---|---|---|")
    for who in ("client", "front"):
        a, b = (1e3 * statistics.median(cpu[m][who]) for m in (False, True))
        print(f"| {who} process | {a:.1f} | {b:.1f} |")
    lat = latency.summarize(runs[True])
    print("\n| streamed runs | p50 | p90 | p99 | mean | n |")
    print("|---|---|---|---|---|---|")
    for k, d in lat.kinds().items():
        print(f"| {k} | {d.p50:.3f} | {d.p90:.3f} | {d.p99:.3f} | {d.mean:.3f} | {d.n} |")


if __name__ == "__main__":
    main()
