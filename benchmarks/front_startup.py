"""CPU seconds of the embedded server's front process per launch, for one or more source trees, interleaved.

    python benchmarks/front_startup.py                                   # this tree, 5 launches
    git archive HEAD | tar -x -C /tmp/before                             # (an older tree to compare)
    python benchmarks/front_startup.py --tree before=/tmp/before --tree after=. --launches 7

One launch is a short server life, as a test's: start the front on the tiny target (one real rank),
wait for /health, one /generate of 8 tokens, SIGTERM. ``front_cpu_s`` is the front's own user + system
time over its whole life (read from its /proc entry after it exited, before it is reaped: SIGTERM ends
the front at once, the rank follows by PR_SET_PDEATHSIG). ``rank_cpu_s`` is the rank's time up to the
SIGTERM, ``start_s`` the wall time from exec to /health 200, and ``front torch`` whether libtorch was
mapped into the front when it served. Trees run in turn (ABAB...), so machine noise hits both alike;
the table gives medians. Each tree runs from its own directory (``PYTHONPATH``), the model is this
checkout's models/tiny/target.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
import requests

from spec_decode.engines.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "tiny" / "target"
# -P: the cwd is not put first on sys.path, so PYTHONPATH decides whose modules run
ENGINE = [sys.executable, "-P", "-m", "spec_decode.engines.embedded"]
BODY = {"text": "The old robot sleeps. ", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


def maps_torch(pid: int) -> bool:
    """Whether libtorch is mapped into process ``pid`` (torch imported there)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def launch(tree: Path, log_path: Path, profile: bool = False) -> dict:
    """One short server life of ``tree``'s front; its numbers. ``profile``: with SPEC_DECODE_PROFILE set
    (the profiler plugin loaded in the front and the rank, as a job's speculative server has it)."""
    port = free_port()
    argv = [*ENGINE, "--model-path", str(TARGET), "--port", str(port)]
    env = {"PYTHONPATH": str(tree)}
    if profile:
        env["SPEC_DECODE_PROFILE"] = str(log_path.with_suffix(".profile.jsonl"))
    srv = ServerProcess(argv, env=env, log_path=log_path, host="127.0.0.1", port=port)
    with srv:
        r = requests.post(srv.base_url + "/generate", json=BODY, timeout=60)
        r.raise_for_status()
        front = psutil.Process(srv.pid)
        torch_in_front = maps_torch(srv.pid)
        ranks = front.children()
        rank_cpu_s = sum(sum(p.cpu_times()[:2]) for p in ranks)
        os.kill(srv.pid, signal.SIGTERM)
        os.waitid(os.P_PID, srv.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: /proc still has its times
        front_cpu_s = sum(front.cpu_times()[:2])
    return {"front_cpu_s": front_cpu_s, "rank_cpu_s": rank_cpu_s, "start_s": srv.start_s, "torch": torch_in_front}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=None, help="NAME=PATH of a source tree (repeat)")
    ap.add_argument("--launches", type=int, default=5, help="launches per tree")
    ap.add_argument("--profile", action="store_true", help="with SPEC_DECODE_PROFILE set (the profiler plugin)")
    args = ap.parse_args()
    trees = {}
    for spec in args.tree or [f"this={ROOT}"]:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    logs = Path(tempfile.mkdtemp(prefix="front_startup_"))
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.launches):
        for name, tree in trees.items():
            row = launch(tree, logs / f"{name}.{i}.log", args.profile)
            rows[name].append(row)
            shown = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
            print(f"# {name} #{i}: {shown}", flush=True)
    print(f"\nlaunches per tree: {args.launches}; cpus: {os.cpu_count()}; load: {os.getloadavg()[0]:.2f}; logs: {logs}")
    print(
        "| tree | front CPU s (median) | front CPU s (min..max) | rank CPU s (median) | start s (median) | front torch |"
    )
    print("|---" * 6 + "|")
    for name, rs in rows.items():
        front = [r["front_cpu_s"] for r in rs]
        print(
            f"| {name} | {statistics.median(front):.2f} | {min(front):.2f}..{max(front):.2f} | "
            f"{statistics.median(r['rank_cpu_s'] for r in rs):.2f} | {statistics.median(r['start_s'] for r in rs):.2f} | "
            f"{'yes' if all(r['torch'] for r in rs) else 'no' if not any(r['torch'] for r in rs) else 'some'} |"
        )


if __name__ == "__main__":
    main()
