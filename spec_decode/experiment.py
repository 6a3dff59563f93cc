"""Reported experiments (experiments/<name>/): the DVC `bench` and `report` stages, and `compare`.

    python -m spec_decode.experiment bench embedded_steps_nccl    # run the sweep -> metrics.json
    python -m spec_decode.experiment report embedded_steps_nccl   # table into README + plots
    python -m spec_decode.experiment compare embedded_steps_nccl  # rebuilt (workspace) vs committed (HEAD)

metrics.json holds, per job, the throughput summary (mean, std, n, 95% CI), accept length, speedup and
phase times: enough for `dvc metrics diff` and for compare's Welch test on summary statistics.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from .report import sweep_summary, write_plots
from .stats import ratio_from_summary
from .tracking import collect

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- table:begin (python -m spec_decode.experiment report) -->", "<!-- table:end -->"


def exp_dir(name: str, root: Path) -> Path:
    return root / "experiments" / name


def bench(name: str, root: Path, extra: list[str]) -> Path:
    d = exp_dir(name, root)
    sweep = d / "sweep"
    if sweep.exists():
        import shutil

        shutil.rmtree(sweep)
    cmd = [sys.executable, str(root / "run.py"), "-m", f"experiment={name}", f"hydra.sweep.dir={sweep}", *extra]
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=root)
    if p.returncode != 0:
        raise SystemExit(f"bench {name}: run.py exited {p.returncode}")
    recs = collect(sweep)
    metrics = to_metrics(recs)
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    failed = [k for k, v in metrics["jobs"].items() if v["status"] != "FINISHED"]
    print(f"{len(metrics['jobs'])} jobs -> {d / 'metrics.json'}" + (f"; FAILED: {failed}" if failed else ""))
    return d / "metrics.json"


def job_key(rec: dict) -> str:
    c = rec["config"]
    if not rec.get("speculative"):
        return f"baseline,nccl={c['nccl']['name']}"
    return f"nccl={c['nccl']['name']},spec.steps={c['spec']['steps']}"


def to_metrics(recs: list[dict]) -> dict:
    jobs = {}
    for r in recs:
        m = r.get("metrics", {})
        t = r.get("throughput_tok_s") or {}
        entry = {"status": r["status"], "engine": r["engine"]["name"]}
        for k in ("mean", "std", "n", "ci95_lo", "ci95_hi", "cv"):
            if k in t:
                entry[f"throughput_tok_s_{k}" if k != "mean" else "throughput_tok_s"] = round(t[k], 4)
        for k in ("accept_len", "accept_rate_draft", "speedup_vs_baseline", "speedup_vs_baseline_ci95_lo",
                  "speedup_vs_baseline_ci95_hi", "cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms"):
            if k in m:
                entry[k] = round(m[k], 4)
        jobs[job_key(r)] = entry
    git = (recs[0].get("provenance", {}).get("git", {}) if recs else {})
    return {"jobs": jobs, "git_commit": git.get("commit"), "git_dirty": git.get("dirty")}


def report(name: str, root: Path) -> None:
    d = exp_dir(name, root)
    recs = collect(d / "sweep")
    if not recs:
        raise SystemExit(f"report {name}: no results under {d / 'sweep'}; run the bench stage first")
    text, _ = sweep_summary(recs)
    write_plots(recs, d)
    (d / "table.txt").write_text(text + "\n")
    readme = d / "README.md"
    if readme.exists():
        body = readme.read_text()
        block = f"{BEGIN}\n```\n{text}\n```\n{END}"
        if BEGIN in body and END in body:
            body = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, body, flags=re.S)
        else:
            body += "\n" + block + "\n"
        readme.write_text(body)
    print(text)


def compare(rebuilt: dict, reported: dict) -> list[str]:
    lines = ["job                          reported tok/s [95% CI]     rebuilt tok/s   ratio [95% CI]        verdict"]
    for key, rep in sorted(reported["jobs"].items()):
        new = rebuilt["jobs"].get(key)
        if new is None or "throughput_tok_s" not in new or "throughput_tok_s" not in rep:
            lines.append(f"{key:<28} missing in the rebuilt metrics")
            continue
        ratio = ratio_from_summary(new["throughput_tok_s"], new.get("throughput_tok_s_std", 0.0),
                                   int(new.get("throughput_tok_s_n", 1)), rep["throughput_tok_s"],
                                   rep.get("throughput_tok_s_std", 0.0), int(rep.get("throughput_tok_s_n", 1)))
        r = ratio.ratio
        # a claim without an interval (n < 2) is a point: any difference counts
        lo, hi = (r, r) if math.isnan(ratio.ci95_lo) else (ratio.ci95_lo, ratio.ci95_hi)
        inside = rep.get("throughput_tok_s_ci95_lo", -1) <= new["throughput_tok_s"] <= rep.get("throughput_tok_s_ci95_hi", -1)
        if lo <= 1.0 <= hi:
            verdict = "within noise" + ("" if inside else " (outside the reported CI, but not significantly different)")
        else:
            verdict = f"DIFFERS by {100 * (r - 1):+.1f}% (Welch 95% CI {100 * (lo - 1):+.1f}% .. {100 * (hi - 1):+.1f}%)"
        ci = f"[{rep.get('throughput_tok_s_ci95_lo', float('nan')):.1f}, {rep.get('throughput_tok_s_ci95_hi', float('nan')):.1f}]"
        lines.append(f"{key:<28} {rep['throughput_tok_s']:8.1f} {ci:<18} {new['throughput_tok_s']:12.1f}   "
                     f"{r:.3f} [{lo:.3f}, {hi:.3f}]   {verdict}")
    return lines


def committed_metrics(path: Path, rev: str, root: Path) -> dict:
    rel = path.resolve().relative_to(root.resolve())
    out = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"compare: {rel} is not in git at {rev}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_decode.experiment", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="run the experiment's sweep and write metrics.json")
    b.add_argument("name")
    b.add_argument("overrides", nargs="*", help="extra Hydra overrides (e.g. tracking=off)")
    r = sub.add_parser("report", help="render the table (into README.md) and plots")
    r.add_argument("name")
    c = sub.add_parser("compare", help="rebuilt metrics.json (workspace) vs the committed one")
    c.add_argument("name")
    c.add_argument("--rev", default="HEAD", help="git revision holding the reported metrics")
    args = ap.parse_args(argv)
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    if not (root / "conf" / "experiment" / f"{args.name}.yaml").exists():
        ap.error(f"no experiment {args.name!r}: conf/experiment/{args.name}.yaml not found")
    if args.cmd == "bench":
        bench(args.name, root, args.overrides)
    elif args.cmd == "report":
        report(args.name, root)
    else:
        path = exp_dir(args.name, root) / "metrics.json"
        if not path.exists():
            ap.error(f"{path} not found: run `dvc repro bench@{args.name}` first")
        print("\n".join(compare(json.loads(path.read_text()), committed_metrics(path, args.rev, root))))


if __name__ == "__main__":
    main()
