"""Tables for docs/nccl-probe.md from the probe's JSON files (python -m spec_decode.probe.nccl --json).

    python benchmarks/gpu/probe_table.py /tmp/spec_decode_session/probe/nccl_probe_*.json

File names nccl_probe_<profile>_r<repetition>.json (what benchmarks/gpu/session.sh writes). Prints:
1. device latency per all-reduce, median us, one column per profile, repetitions as "r1 / r2";
2. the same for the eager per-call latency;
3. per profile: p90s, NCCL's algorithm/protocol per size, transport and version.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PROFILES = ("default", "tuned", "no_p2p")


def load(paths: list[Path]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for p in sorted(paths):
        m = re.match(r"nccl_probe_(.+)_r(\d+)\.json$", p.name)
        if not m:
            raise SystemExit(f"{p}: expected a name nccl_probe_<profile>_r<n>.json")
        runs.setdefault(m.group(1), []).append(json.loads(p.read_text()))
    return runs


def _cells(results: list[dict], size: str, key: str) -> str:
    vals = [r["sizes"].get(size, {}).get(key) for r in results]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in vals)


def comparison(runs: dict[str, list[dict]], key: str, title: str) -> str:
    profiles = [p for p in PROFILES if p in runs] + sorted(set(runs) - set(PROFILES))
    sizes = sorted({s for rs in runs.values() for r in rs for s in r["sizes"]}, key=int)
    out = [
        f"{title} (median us per all-reduce; repetitions r1 / r2)",
        "",
        "| bytes | " + " | ".join(profiles) + " |",
        "|---|" + "---|" * len(profiles),
    ]
    for s in sizes:
        out.append(f"| {s} | " + " | ".join(_cells(runs[p], s, key) for p in profiles) + " |")
    return "\n".join(out)


def detail(profile: str, results: list[dict]) -> str:
    first = results[0]
    m = first.get("machine", {})
    head = (
        f"nccl={profile}: env {first.get('env') or '{}'}; NCCL {first.get('nccl_version') or m.get('torch_nccl_version')}; "
        f"{m.get('gpu')}; transports {first.get('transports')}; iters {first.get('iters')} x rounds {first.get('rounds')}"
    )
    out = [
        head,
        "",
        "| bytes | device p90 us | eager p90 us | rounds host-ahead | NCCL choice | correct |",
        "|---|---|---|---|---|---|",
    ]
    for s in first["sizes"]:
        c = first.get("choices", {}).get(s)
        choice = (
            f"{c['algorithm']}/{c['protocol']}" + (f" x{c['channels']}ch" if c.get("channels") else "") if c else "-"
        )
        out.append(
            f"| {s} | {_cells(results, s, 'device_p90_us')} | {_cells(results, s, 'p90_us')} | "
            f"{' / '.join(str(r['sizes'][s].get('device_rounds', '-')) for r in results)} | {choice} | "
            f"{all(r['sizes'][s]['correct'] for r in results)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", type=Path)
    args = ap.parse_args(argv)
    runs = load(args.json)
    print(comparison(runs, "device_median_us", "Device latency"))
    print()
    print(comparison(runs, "median_us", "Eager per-call latency"))
    for p, rs in runs.items():
        print()
        print(detail(p, rs))


if __name__ == "__main__":
    main()
