"""Per-variable NCCL ablation: which variable of a profile changes all-reduce latency.

    python -m spec_decode.probe.ablation --nccl tuned --world-size 2                # conf/nccl/tuned.yaml
    python -m spec_decode.probe.ablation --nccl tuned --world-size 2 --sglang-launcher  # + SGLang's writes
    python -m spec_decode.probe.ablation --env NCCL_PROTO=LL --env NCCL_ALGO=Ring --backend gloo  # CI

Arms, each one probe (spec_decode.probe.nccl.probe, fresh rank processes): ``default`` (none of the
profile's variables), ``all`` (the whole profile), ``-X`` (the profile without X: leave-one-out) and
``+X`` (X alone: one-at-a-time). Arms with the same variables are measured once (with two variables,
``-A`` is ``+B``). Per arm and size: the device median (NCCL; what a CUDA-graph replay pays) or the
eager median (gloo), and its ratio to ``default``. With ``--sglang-launcher`` every arm also gets what
SGLang's launcher writes for its ranks where unset (spec_decode.engines.sglang.rank_nccl_env), as a
server would run. Why it matters (NCCL source, issue 32): under NCCL_PROTO=LL, NCCL_BUFFSIZE sizes only
the Simple protocol's buffer; NCCL_NTHREADS=512 is LL's default; NCCL_MAX_NCHANNELS is a ceiling;
NCCL_P2P_LEVEL=SYS changes the transport across host bridges. A bundle against nothing cannot show it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spec_decode.engines.sglang import rank_nccl_env
from spec_decode.probe.nccl import DEFAULT_SIZES, probe, profile_env


def arms(profile: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """(label, variables) of every arm, in table order."""
    out = [("default", {}), ("all", dict(profile))]
    if len(profile) > 1:
        out += [(f"-{k}", {n: v for n, v in profile.items() if n != k}) for k in profile]
        out += [(f"+{k}", {k: v}) for k, v in profile.items()]
    return out


def ablate(
    world_size: int,
    backend: str,
    sizes: list[int],
    profile: dict[str, str],
    sglang_launcher: bool = False,
    **probe_kwargs,
) -> dict:
    """Probe every arm (each distinct set of variables once); per arm: its variables, the NCCL_*
    variables its rank processes really held, and per size the figure and its ratio to default."""
    measured: dict[tuple, dict] = {}
    rows = []
    for label, env in arms(profile):
        if sglang_launcher:
            env = rank_nccl_env(env, world_size, [])
        key = tuple(sorted(env.items()))
        if key not in measured:
            measured[key] = probe(world_size, backend, sizes, env=env, **probe_kwargs)
        res = measured[key]
        field = "device_median_us" if backend == "nccl" else "median_us"
        rows.append(
            {
                "arm": label,
                "env": env,
                "rank_env": res.get("machine", {}).get("nccl_env", {}),
                "transports": res.get("transports"),
                "choices": res.get("choices", {}),
                "us": {s: v.get(field) for s, v in res["sizes"].items()},
                "correct": res["correct"],
            }
        )
    base = rows[0]["us"]
    for r in rows:
        r["vs_default"] = {s: (v / base[s] if v and base.get(s) else None) for s, v in r["us"].items()}
    return {
        "backend": backend,
        "world_size": world_size,
        "profile": profile,
        "sglang_launcher": sglang_launcher,
        "figure": "device median us" if backend == "nccl" else "eager median us",
        "probes": len(measured),
        "arms": rows,
    }


def table(result: dict) -> str:
    sizes = list(result["arms"][0]["us"])
    head = "| arm | " + " | ".join(f"{s} B {result['figure']} (x default)" for s in sizes) + " | NCCL choice |"
    lines = [head, "|---" * (len(sizes) + 2) + "|"]
    for r in result["arms"]:
        cells = [
            ("-" if r["us"][s] is None else f"{r['us'][s]:.1f}")
            + ("" if r["vs_default"][s] is None else f" ({r['vs_default'][s]:.2f})")
            for s in sizes
        ]
        choice = ", ".join(f"{c['algorithm']}/{c['protocol']}" for c in r["choices"].values()) or "-"
        lines.append(f"| {r['arm']} | " + " | ".join(cells) + f" | {choice} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.probe.ablation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes, comma-separated")
    ap.add_argument("--nccl", default=None, metavar="PROFILE", help="an NCCL profile of conf/nccl/ (e.g. tuned)")
    ap.add_argument("--conf-dir", type=Path, default=Path("conf"))
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="NCCL variable (repeat)")
    ap.add_argument("--sglang-launcher", action="store_true", help="add SGLang's launcher writes to every arm")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per probe pass")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        profile = profile_env(args.nccl, args.conf_dir) if args.nccl else {}
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError as e:
        ap.error(str(e))
    bad = [kv for kv in args.env if "=" not in kv or not kv.startswith("NCCL_")]
    if bad:
        ap.error(f"--env {bad[0]}: expected NCCL_NAME=VALUE")
    profile.update(dict(kv.split("=", 1) for kv in args.env))
    if not profile:
        ap.error("nothing to ablate: give --nccl PROFILE or --env NCCL_NAME=VALUE")
    res = ablate(
        args.world_size,
        args.backend,
        sizes,
        profile,
        args.sglang_launcher,
        iters=args.iters,
        warmup=args.warmup,
        rounds=args.rounds,
        timeout_s=args.timeout_s,
    )
    print(
        f"backend={args.backend} world_size={args.world_size} profile={args.nccl or '-'} {profile} "
        f"sglang_launcher={args.sglang_launcher} probes={res['probes']}"
    )
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
