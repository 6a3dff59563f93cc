"""results.json: the one authoritative record of a job (DESIGN §3.5). MLflow, reports and DVC
metrics are views of it. This module builds, finishes, writes and reads it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from . import provenance, stats
from .config import ExperimentConfig, config_hash, resolved_dict
from .parsers import decode_log, profile

SCHEMA_VERSION = 1
FILENAME = "results.json"


def new_record(cfg: ExperimentConfig, ctx: Any, role: str, extra_env: dict[str, str],
               warnings: list[str]) -> dict:
    conf = resolved_dict(cfg)
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "RUNNING",
        "error": None,
        "role": role,  # spec | baseline
        "name": ctx.run_name,
        "experiment": cfg.name,
        "overrides": list(ctx.overrides),
        "config": conf,
        "config_hash": config_hash(conf),
        "engine": {"name": cfg.engine.name, "version": None},
        "speculative": cfg.speculative,
        "server_env_extra": provenance.redact_env(extra_env),
        "launches": [],
        "runs": [],
        "warnings": list(warnings),
        "started_at": time.time(),
        "out_dir": str(ctx.out_dir),
        "provenance": provenance.collect(ctx.root, {
            "target": cfg.model.path, "drafter": cfg.drafter.path, "prompts": cfg.benchmark.prompts,
        }),
    }


def finish(rec: dict, cfg: ExperimentConfig, status: str, error: str | None, out_dir: Path,
           log_path: Path, log_windows: list[tuple[int, int]], baseline: dict | None) -> None:
    rec["status"], rec["error"] = status, error
    rec["ended_at"] = time.time()
    live = rec.pop("server_env_live", None)
    rec["server_env"] = provenance.filter_env(live) if live else None
    tree = rec.pop("server_env_tree_live", None) or {}
    if tree:
        # Every process of the server (each TP rank) read back: the NCCL profile must reach all.
        rec["server_env_processes"] = {str(pid): provenance.filter_env(env) for pid, env in tree.items()}
        nccl = {pid: {k: v for k, v in env.items() if k.startswith("NCCL_")}
                for pid, env in rec["server_env_processes"].items()}
        if len({tuple(sorted(v.items())) for v in nccl.values()}) > 1:
            rec["warnings"].append(f"the server's processes do not share one NCCL environment: {nccl}")
    info = rec.get("server_info") or {}
    rec["engine"]["version"] = info.get("version")
    runs = rec["runs"]
    metrics: dict[str, float] = {}
    if runs:
        tput = [r["throughput_tok_s"] for r in runs]
        s = stats.summarize(tput)
        rec["throughput_tok_s"] = s.as_dict()
        metrics["throughput_tok_s"] = s.mean
        for k in ("median", "std", "cv", "ci95_lo", "ci95_hi"):
            metrics[f"throughput_tok_s_{k}"] = getattr(s, k)
        metrics["mde_pct"] = 100 * stats.min_detectable_effect(s.cv, s.n)
        if s.cv > stats.CV_WARN:
            rec["warnings"].append(
                f"run-to-run CV {100 * s.cv:.1f}% > {100 * stats.CV_WARN:.0f}%: differences below "
                f"~{metrics['mde_pct']:.1f}% are not detectable with {s.n} runs"
            )
        if cfg.benchmark.launches > 1:
            groups = [[r["throughput_tok_s"] for r in runs if r["launch"] == i]
                      for i in range(cfg.benchmark.launches)]
            rec["variance_components"] = stats.variance_components(groups)
    starts = [x["server_start_s"] for x in rec["launches"] if x.get("server_start_s") is not None]
    if starts:
        metrics["server_start_s"] = sum(starts) / len(starts)
    if cfg.speculative and runs:
        acc = stats.acceptance(
            sum(r["completion_tokens"] for r in runs),
            sum(r["spec_verify_ct"] or 0 for r in runs),
            sum(r["spec_num_correct_drafts"] or 0 for r in runs) if runs[0]["spec_num_correct_drafts"] is not None else None,
            sum(r["spec_num_proposed_drafts"] or 0 for r in runs) if runs[0]["spec_num_proposed_drafts"] is not None else None,
            cfg.spec.num_draft_tokens or 0,
        )
        rec["acceptance"] = {**acc, "source": "meta_info counters (run-scoped)",
                             "per_run_accept_len": [r["completion_tokens"] / r["spec_verify_ct"]
                                                    for r in runs if r["spec_verify_ct"]]}
        metrics.update({k: v for k, v in acc.items() if v is not None})
    # Phase profile inside the timed windows: the logging rank's, the others compared with it.
    if cfg.speculative:
        windows = [(r["start_wall"], r["end_wall"]) for r in runs]
        summary, per_run = profile.summarize_run_windows(out_dir / "profile.jsonl", windows)
        if summary is None:
            why = "profiling off (benchmark.profile=false)" if not cfg.benchmark.profile else \
                "no profile lines from rank 0 in the timed runs (plugin not loaded?)"
            rec["profile"] = {"missing": why}
            if cfg.benchmark.profile and runs:
                rec["warnings"].append(f"phase profile missing: {why}")
        else:
            # Time per request outside the speculative cycles: prefill, HTTP, JSON (explains the gap
            # between measured tok/s and accept_len / cycle time).
            outside = [r["wall_s"] * 1e3 - sum(c["cycle_ms"] for c in w) for r, w in zip(runs, per_run) if w]
            summary["non_cycle_ms_per_request"] = sum(outside) / len(outside) if outside else None
            # Every verify is one cycle: a complete profile has exactly the runs' verify count.
            verify_ct = sum(r["spec_verify_ct"] or 0 for r in runs)
            summary["spec_verify_ct"] = verify_ct
            summary["complete"] = summary["cycles"] == verify_ct
            if not summary["complete"]:
                rec["warnings"].append(
                    f"phase profile incomplete: {summary['cycles']} cycles from rank 0 in the timed "
                    f"runs, but the runs' meta_info says {verify_ct} verifies")
            agreement = summary.get("rank_agreement")
            if agreement and not agreement["ok"]:
                rec["warnings"].append(
                    f"phase profiles of the {summary['ranks']} ranks disagree (cycle counts differ or "
                    f"a rank's mean cycle is more than {agreement['tolerance_pct']:.0f}% from rank 0's): "
                    + ", ".join(f"rank {r}: {a['cycles']} cycles, {a['cycle_ms_diff_pct']:+.1f}%"
                                for r, a in agreement["ranks"].items()))
            rec["profile"] = summary
            for k in ("cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms",
                      "draft_pct", "verify_pct", "extend_pct", "other_pct"):
                metrics[k] = summary[k]
    # Decode-log summary inside the timed windows.
    lines = []
    for lo, hi in log_windows:
        with open(log_path, "rb") as f:
            f.seek(lo)
            lines += f.read(hi - lo).decode(errors="replace").splitlines()
    dl = decode_log.summarize(decode_log.parse_lines(lines))
    rec["decode_log"] = dl.__dict__
    if dl.gen_throughput_tok_s_median is not None:
        metrics["decode_log_gen_throughput_tok_s"] = dl.gen_throughput_tok_s_median
    # Speedup against the matching baseline.
    if baseline is not None and runs and baseline.get("runs"):
        b = [r["throughput_tok_s"] for r in baseline["runs"]]
        ratio = stats.ratio_of_means([r["throughput_tok_s"] for r in runs], b)
        rec["baseline"] = {"out_dir": baseline.get("out_dir"), "mlflow_run_id": baseline.get("mlflow_run_id"),
                           "throughput_tok_s": baseline.get("throughput_tok_s")}
        rec["speedup_vs_baseline"] = ratio.as_dict()
        metrics["speedup_vs_baseline"] = ratio.ratio
        metrics["speedup_vs_baseline_ci95_lo"] = ratio.ci95_lo
        metrics["speedup_vs_baseline_ci95_hi"] = ratio.ci95_hi
        metrics["baseline_throughput_tok_s"] = baseline["throughput_tok_s"]["mean"]
    if rec.get("nccl_probe"):
        from .nccl_probe import metrics_of

        metrics.update(metrics_of(rec["nccl_probe"]))
        rec["provenance"]["nccl"] = {k: rec["nccl_probe"].get(k) for k in
                                     ("backend", "nccl_version", "algorithms", "protocols")}
    rec["metrics"] = {k: float(v) for k, v in metrics.items() if v is not None}
    from .checks import run_checks

    rec["checks"] = run_checks(rec)


def write(out_dir: Path, rec: dict) -> Path:
    """Atomic write; secret values of our environment are scrubbed from the whole record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(provenance.dumps_clean(rec, provenance.secret_values()) + "\n")
    os.replace(tmp, path)
    return path


def read(out_dir: Path) -> dict | None:
    path = Path(out_dir) / FILENAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def job_summary(rec: dict) -> str:
    """A few console lines for one finished job."""
    m = rec.get("metrics", {})
    head = f"[{rec['status']}] {rec.get('name') or '(defaults)'} ({rec['role']}, engine={rec['engine']['name']})"
    lines = [head]
    if rec.get("error"):
        lines.append(f"  error: {rec['error']}")
    if "throughput_tok_s" in m:
        lines.append(
            f"  throughput {m['throughput_tok_s']:.1f} tok/s  95% CI [{m['throughput_tok_s_ci95_lo']:.1f}, "
            f"{m['throughput_tok_s_ci95_hi']:.1f}]  CV {100 * m['throughput_tok_s_cv']:.1f}%  "
            f"({len(rec['runs'])} runs)"
        )
    if "accept_len" in m:
        lines.append(f"  accept len {m['accept_len']:.2f}  draft accept rate {m.get('accept_rate_draft', float('nan')):.2f}")
    if "cycle_ms" in m:
        lines.append(
            f"  cycle {m['cycle_ms']:.2f} ms = draft {m['draft_ms']:.2f} ({m['draft_pct']:.0f}%) + verify "
            f"{m['verify_ms']:.2f} ({m['verify_pct']:.0f}%) + re-extend {m['extend_ms']:.2f} "
            f"({m['extend_pct']:.0f}%) + other {m['other_ms']:.2f} ({m['other_pct']:.0f}%)"
        )
    if "speedup_vs_baseline" in m:
        lines.append(
            f"  speedup vs baseline {m['speedup_vs_baseline']:.3f}x  95% CI "
            f"[{m['speedup_vs_baseline_ci95_lo']:.3f}, {m['speedup_vs_baseline_ci95_hi']:.3f}]"
        )
    for c in rec.get("checks", []):
        if c.get("ok") is False:
            lines.append(f"  CHECK FAILED {c['name']}: {c['message']}")
    for w in rec.get("warnings", []):
        lines.append(f"  warning: {w}")
    lines.append(f"  -> {rec.get('out_dir')}/{FILENAME}")
    return "\n".join(lines)
