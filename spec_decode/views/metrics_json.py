"""An experiment's metrics.json, both ways: to_metrics (job records -> one entry per job, keyed by the
job's override set: status, config axes, throughput summary, accept length, speedup with CI, phases,
failed checks, issue 21's sections) and records_from_metrics (the committed file -> records the
report, the headline and compare render)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from spec_decode.analysis import blocks
from spec_decode.analysis.acceptance import rates_from_metrics
from spec_decode.analysis.sections import PHASE_METRICS
from spec_decode.record.results import Check, EngineInfo, JobRecord, section
from spec_decode.record.sections import (
    Speedup,
    acceptance_from,
    categories_from,
    latency_from,
    lossless_from,
    summary_from,
)

SUMMARY = ("mean", "std", "n", "ci95_lo", "ci95_hi", "cv", "robust_cv")


METRICS = (
    "accept_len",
    "accept_rate_draft",
    "speedup_vs_baseline",
    "speedup_vs_baseline_ci95_lo",
    "speedup_vs_baseline_ci95_hi",
    "speedup_ci95_halfwidth_pct",
    "speedup_vs_baseline_rerun95_lo",  # the block design's rerun interval (analysis.blocks)
    "speedup_vs_baseline_rerun95_hi",
    "non_cycle_pct",
    *PHASE_METRICS,
    "baseline_throughput_tok_s",
    "host_load1",
    "host_load1_max",
    "host_steal_pct",
    "host_busy_pct",
)  # host_*: analysis/host.py


AXES = ("hardware", "model", "engine", "nccl", "drafter")


# Issue 21's flat metrics, kept by name pattern (their count depends on the steps and the categories):
# acceptance per draft position and per request, token latency percentiles, the lossless match rate,
# per-category acceptance and tok/s; and each server process's CPU (analysis.host.server_cpu).
ISSUE21_METRICS = re.compile(
    r"^(accept_rate_pos\d+|accept_len_request_(weighted|mean)|(ttft|itl|tpot|e2e)_ms_p\d+"
    r"|lossless_match_rate|category_.+_(accept_len|throughput_tok_s)"
    r"|concurrency|request_(tok_s|accept_len)_p\d+|running_req_(median|max)|load_\w+_ms_p\d+"
    r"|(baseline_)?server_cpu_(pct|ms_per_1k_tok)(\.[\w.\-]+)?)$"
)


SECTIONS = ("latency", "categories", "lossless")  # issue 21's record sections kept whole (small; typed in the record)


def job_key(rec: JobRecord) -> str:
    """A job's full override set (Hydra's override_dirname), so every sweep axis keeps its own entry."""
    return rec.label


def to_metrics(recs: list[JobRecord]) -> dict:
    """metrics.json: one entry per job; with the block design (benchmark.block swept) also one per cell,
    folded over its blocks (``cells``); the host fingerprint and what the intervals cover."""
    jobs: dict[str, dict] = {}
    for i, r in enumerate(recs):
        key = job_key(r)
        if key in jobs:
            raise ValueError(f"two jobs share the metrics key {key!r} ({jobs[key]['out_dir']} and {r.out_dir})")
        jobs[key] = _entry(i, r)
    git = (recs[0].provenance.git or {}) if recs else {}
    hosts = [r.provenance.host for r in recs if r.provenance.host]
    out = {
        "jobs": jobs,
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "host": hosts[0] if hosts else None,
        "interval": blocks.interval_label(recs),
    }
    if git.get("tree"):  # the files' tree (since 2026-12-06): names what ran where the .git lagged
        out["git_tree"], out["git_untracked"] = git["tree"], git.get("untracked") or []
    if any(h != hosts[0] for h in hosts):  # a sweep spread over machines (submitit): say so
        out["hosts_differ"] = True
    if blocks.has_blocks(recs):
        out["cells"] = {job_key(c): _entry(i, c) for i, c in enumerate(blocks.cells(recs))}
    return out


def _entry(i: int, r: JobRecord) -> dict:
    m, t = r.metrics, r.throughput_tok_s
    bench = r.config.get("benchmark") or {}
    entry: dict = {
        "index": i,
        "status": r.status,
        "role": r.role,
        "engine": r.engine.name,
        **({"nccl_inert": r.engine.nccl_inert} if r.engine.nccl_inert else {}),
        "out_dir": Path(r.out_dir).name,
        "axes": {
            **{g: r.choice(g) for g in AXES},
            "spec.steps": r.steps,
            **{
                f"benchmark.{k}": bench[k]
                for k in ("block", "replicate", "concurrency", "request_rate")
                if bench.get(k)
            },
        },
    }
    if r.error:
        entry["error"] = r.error
    for k in SUMMARY:
        if t is not None and getattr(t, k) is not None:
            entry["throughput_tok_s" if k == "mean" else f"throughput_tok_s_{k}"] = round(getattr(t, k), 4)
    entry.update({k: round(m[k], 4) for k in METRICS if k in m})
    # 6 places: the cost model multiplies the per-position rates, a report rebuilt from this file
    # must print the same predictions as one from the records
    entry.update({k: round(v, 6) for k, v in m.items() if ISSUE21_METRICS.match(k)})
    if r.acceptance and r.acceptance.histogram:
        entry["acceptance"] = {"histogram": r.acceptance.histogram, "source": r.acceptance.source}
    simulated = r.forced_accept_len
    if simulated is not None:  # forced acceptance: the record is performance-only
        entry["axes"]["spec.simulate_accept_len"] = simulated
    for name in SECTIONS:
        value = section(r, name)
        if value:
            if name == "categories":
                value = {k: c.as_dict() for k, c in value.items()}
            else:  # latency, lossless
                value = value.as_dict()
            entry[name] = value
    if r.speedup_vs_baseline:
        entry["speedup_method"] = r.speedup_vs_baseline.how
    entry["checks"] = {c.name: c.ok for c in r.checks}
    if "interval" in r.extra:  # a cell folded over blocks: how its interval was taken
        entry["interval"] = r.extra["interval"]
    return entry


def _axes_from_key(key: str) -> dict:
    """Schema-1 metrics.json entries carry no axes: read them from the key (``nccl=tuned,spec.steps=2``)."""
    pairs = dict(p.split("=", 1) for p in key.split(",") if "=" in p)
    return {
        "nccl": pairs.get("nccl", "default"),
        "spec.steps": int(pairs["spec.steps"]) if "spec.steps" in pairs else None,
    }


def read(path: Path) -> dict:
    """A sweep's metrics.json, or ValueError naming the file and what it lacks (not JSON, no jobs: a
    summary.json or a drafter experiment's, an empty sweep)."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(got, dict) or not isinstance(got.get("jobs"), dict):
        raise ValueError(
            f"{path} is not a metrics.json (no 'jobs'; summary.json is not one, nor a drafter experiment's: "
            "python -m spec_decode.views.drafter_experiments report NAME)"
        )
    if not got["jobs"]:
        raise ValueError(f"{path} has no jobs (an empty sweep)")
    return got


CLAIM = "CLAIM"  # a job's status in a metrics.json that holds a source's figures, not a run of ours


def claim(metrics: dict) -> str | None:
    """What a metrics.json whose every job is a source's claim (status CLAIM ...) holds, or None."""
    jobs = (metrics.get("cells") or metrics.get("jobs") or {}).values()
    if jobs and all(str(e.get("status", "")).startswith(CLAIM) for e in jobs):
        return "holds a source's claim, not a measurement" + (f" ({metrics['note']})" if metrics.get("note") else "")
    return None


def records_from_metrics(metrics: dict) -> list[JobRecord]:
    """The jobs of a metrics.json as records the report renders (what metrics.json keeps of them)."""
    out = []
    for n, (key, e) in enumerate(sorted(metrics["jobs"].items(), key=lambda kv: kv[1].get("index", 0))):
        axes = e.get("axes") or _axes_from_key(key)
        role = e.get("role") or ("baseline" if key.startswith("baseline") else "spec")
        config = {g: {"name": axes.get(g)} for g in AXES}
        config["spec"] = {"steps": axes.get("spec.steps"), "simulate_accept_len": axes.get("spec.simulate_accept_len")}
        config["benchmark"] = {
            k: axes.get(f"benchmark.{k}", d) for k, d in (("block", 0), ("replicate", 0), ("concurrency", 1))
        }
        m = {k: e[k] for k in ("throughput_tok_s", *METRICS) if isinstance(e.get(k), (int, float))}
        m.update({k: v for k, v in e.items() if ISSUE21_METRICS.match(k) and isinstance(v, (int, float))})
        acc = None
        if e.get("acceptance"):
            acc = dataclasses.replace(
                acceptance_from(e["acceptance"]),  # its histogram and source
                per_position=rates_from_metrics(m) or None,
                accept_len_weighted=m.get("accept_len_request_weighted"),
                accept_len_unweighted=m.get("accept_len_request_mean"),
            )
        for p in ("draft", "verify", "extend", "other"):  # schema 1 kept the ms, not the shares
            if f"{p}_pct" not in m and f"{p}_ms" in m and m.get("cycle_ms"):
                m[f"{p}_pct"] = 100 * m[f"{p}_ms"] / m["cycle_ms"]
        for k in SUMMARY[1:]:
            if f"throughput_tok_s_{k}" in e:
                m[f"throughput_tok_s_{k}"] = e[f"throughput_tok_s_{k}"]
        summary = {
            k: e["throughput_tok_s" if k == "mean" else f"throughput_tok_s_{k}"]
            for k in SUMMARY
            if ("throughput_tok_s" if k == "mean" else f"throughput_tok_s_{k}") in e
        }
        out.append(
            JobRecord(
                role=role,
                name=key,
                experiment="",
                config=config,
                config_hash="",
                engine=EngineInfo(e.get("engine", "?"), nccl_inert=e.get("nccl_inert")),
                speculative=role == "spec",
                status=e.get("status", "?"),
                error=e.get("error"),
                metrics=m,
                throughput_tok_s=summary_from(summary),
                started_at=float(n),
                out_dir=e.get("out_dir", ""),
                checks=[Check(c, ok, None, "", "") for c, ok in (e.get("checks") or {}).items()],
                speedup_vs_baseline=Speedup(method=e["speedup_method"]) if "speedup_method" in e else None,
                acceptance=acc,
                categories=categories_from(e.get("categories")),
                lossless=lossless_from(e.get("lossless")),
                latency=latency_from(e.get("latency")),
            )
        )
    return out
