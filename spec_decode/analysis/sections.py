"""The record's derived sections, one pure function each (``analysis.finish.finish`` calls them in turn).

Each takes what was measured (the job's ``RunRecord``s, its launches, the profile file, the decode-log
lines) and returns a ``Section``: the record fields it fills, its flat metrics (units in the names) and
its warnings. None of them reads or writes a record: each can be tested alone on a known input.

Where a section's figure comes from (the table in docs/architecture.md): throughput and speedup from
``analysis.stats``, acceptance from ``stats.acceptance`` (run-scoped counters) and
``analysis.acceptance`` (per position, per request), the phase profile from ``parsers.profile``, the
profiler's effect from ``analysis.profiler_effect``, the decode log from ``parsers.decode_log``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from spec_decode.analysis import acceptance, latency, profiler_effect, stats
from spec_decode.parsers import decode_log, profile
from spec_decode.record.payloads import NcclProbe
from spec_decode.record.provenance import Provenance, filter_env
from spec_decode.record.sections import Acceptance, Profile, Speedup, Summary, decode_log_from, profile_from
from spec_decode.record.typed import ABSENT

if TYPE_CHECKING:
    from spec_decode.record.measured import Launch, ProfilePass, Request
    from spec_decode.record.runs import RunRecord

# the phase profile's metrics: ms per cycle and share of the cycle, per phase
PHASE_METRICS = ("cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms")
PHASE_METRICS += ("draft_pct", "verify_pct", "extend_pct", "other_pct")  # (cycle_ms is the whole: no share)


@dataclass
class Section:
    """What one section adds to a record: fields (record attribute -> value), metrics, warnings."""

    fields: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def throughput(runs: Sequence[RunRecord], launches: int) -> Section:
    """tok/s over the timed runs (mean, t-CI, CVs, MDE); with launches > 1 the variance between
    launches vs within them. A CV above ``stats.CV_WARN`` warns with the smallest detectable effect."""
    if not runs:
        return Section()
    s = stats.summarize([r.throughput_tok_s for r in runs])
    out = Section({"throughput_tok_s": s}, {"throughput_tok_s": s.mean})
    for k in ("median", "std", "cv", "robust_cv", "ci95_lo", "ci95_hi"):
        out.metrics[f"throughput_tok_s_{k}"] = getattr(s, k)
    out.metrics["mde_pct"] = 100 * stats.min_detectable_effect(s.cv, s.n)
    if s.cv > stats.CV_WARN:
        out.warnings.append(
            f"run-to-run CV {100 * s.cv:.1f}% > {100 * stats.CV_WARN:.0f}%: differences below "
            f"~{out.metrics['mde_pct']:.1f}% are not detectable with {s.n} runs"
        )
    if launches > 1:
        groups = [[r.throughput_tok_s for r in runs if r.launch == i] for i in range(launches)]
        out.fields["variance_components"] = stats.variance_components(groups)
    return out


def server_start(launches: Sequence[Launch]) -> Section:
    """The mean server start time over the launches that started."""
    starts = [x.server_start_s for x in launches if x.server_start_s is not None]
    return Section(metrics={"server_start_s": sum(starts) / len(starts)} if starts else {})


def acceptance_counters(runs: Sequence[RunRecord], num_draft_tokens: int) -> Section:
    """Accept length and draft accept rate from the runs' meta_info counters (run-scoped)."""

    def total(key: str) -> int | None:
        vals = [getattr(r, key) for r in runs]
        return None if vals[0] is None else sum(v or 0 for v in vals)

    acc = stats.acceptance(
        sum(r.completion_tokens for r in runs),
        total("spec_verify_ct") or 0,
        total("spec_num_correct_drafts"),
        total("spec_num_proposed_drafts"),
        num_draft_tokens,
    )
    return Section(
        {
            "acceptance": Acceptance(
                **acc,
                accept_len_source="meta_info counters (run-scoped)",
                per_run_accept_len=[r.completion_tokens / r.spec_verify_ct for r in runs if r.spec_verify_ct],
            )
        },
        {k: v for k, v in acc.items() if v is not None},
    )


def profiler_cost(
    profile_pass: ProfilePass | None, profiled_runs: Sequence[RunRecord], runs: Sequence[RunRecord]
) -> Section:
    """The profiled pass's account with the profiler's measured effect on tok/s (its on/dormant pairs)."""
    if profile_pass is None:
        return Section()
    effect = profiler_effect.effect(
        [r.throughput_tok_s for r in profiled_runs],
        profile_pass.dormant_tok_s or [],
        [r.throughput_tok_s for r in runs],
    )
    with_effect = dataclasses.replace(profile_pass, effect=effect)
    return Section({"profile_pass": with_effect}, profiler_effect.metrics_of(effect))


def phase_profile(
    path: Path,
    prof_runs: Sequence[RunRecord],
    timed_runs: bool,
    profile_on: bool,
    any_runs: bool,
    host_stamps_na: str | None = None,
) -> tuple[Section, list[list[dict]] | None]:
    """The phase profile inside the profiled runs' windows (the profiled pass's, or with ``timed_runs``
    the timed runs' of an older protocol): rank 0's cycles, the other ranks compared with it, the time
    outside the cycles per request, and whether every verify has its cycle. Also returns each run's
    cycles (the per-request acceptance reads them)."""
    where = "timed runs" if timed_runs else "profiled pass"
    summary, per_run = profile.summarize_run_windows(
        path, [(r.start_wall, r.end_wall) for r in prof_runs], requests=[(r.rid, r.spec_verify_ct) for r in prof_runs]
    )
    if summary is None:
        why = (
            "profiling off (benchmark.profile=false)"
            if not profile_on
            else f"no profile lines from rank 0 in the {where} (plugin not loaded?)"
        )
        return Section(
            {"profile": Profile(missing=why)},
            warnings=[f"phase profile missing: {why}"] if profile_on and any_runs else [],
        ), per_run
    prof = profile_from(summary)
    out = Section({"profile": prof})
    # Per request: tok/s inside the decode on the wall clock vs from the cycle durations, and the time
    # outside the cycles (prefill, HTTP, gaps between cycles) as its own figure.
    timing = [profile.run_timing(w, r.start_wall, r.end_wall, r.wall_s) for r, w in zip(prof_runs, per_run)]
    prof.per_run = timing
    have = [t for t in timing if t is not None]
    prof.non_cycle_ms_per_request = sum(t["non_cycle_ms"] for t in have) / len(have) if have else None
    if have:
        out.metrics["non_cycle_ms"] = prof.non_cycle_ms_per_request
        out.metrics["non_cycle_pct"] = 100 * sum(t["non_cycle_ms"] for t in have) / sum(t["wall_ms"] for t in have)
        for part in ("head", "gap", "tail"):
            out.metrics[f"non_cycle_{part}_ms"] = sum(t[f"{part}_ms"] for t in have) / len(have)
    # Every verify is one cycle: a complete profile has exactly the runs' verify count.
    verify_ct = sum(r.spec_verify_ct or 0 for r in prof_runs)
    prof.spec_verify_ct = verify_ct
    prof.measured_in = (
        "the timed runs (profiler on)"
        if timed_runs
        else "the profiled pass (profiler on; the timed runs ran it dormant)"
    )
    prof.measured_in_tok_s = stats.summarize([r.throughput_tok_s for r in prof_runs]).mean
    prof.complete = prof.cycles == verify_ct
    if not prof.complete:
        out.warnings.append(
            f"phase profile incomplete: {prof.cycles} cycles from rank 0 in the {where}, "
            f"but the runs' meta_info says {verify_ct} verifies"
        )
    agreement = prof.rank_agreement
    if agreement and not agreement["ok"]:
        out.warnings.append(
            f"phase profiles of the {prof.ranks} ranks disagree (cycle counts differ or a rank's mean "
            f"cycle is more than {agreement['tolerance_pct']:.0f}% from rank 0's): "
            + ", ".join(
                f"rank {r}: {a['cycles']} cycles, {a['cycle_ms_diff_pct']:+.1f}%" for r, a in agreement["ranks"].items()
            )
        )
    if host_stamps_na:
        prof.host_stamps_na = host_stamps_na
    for k in PHASE_METRICS:
        out.metrics[k] = getattr(prof, k)
    return out, per_run


def request_acceptance(
    steps: int,
    runs: Sequence[RunRecord],
    run_cycles: list[list[dict]] | None,
    requests: list[Request] | None,
    counters: Acceptance | None,
) -> Section:
    """Acceptance per draft position and per request: from the profile's cycles where it has them, else
    from the runs' meta_info histograms; merged into the counters' ``acceptance``."""
    per_request = acceptance.summarize(steps, runs, run_cycles, requests or None)
    if per_request is None:
        return Section()
    merged = counters.with_requests(per_request) if counters is not None else per_request
    out = Section({"acceptance": merged}, acceptance.metrics_of(per_request))
    if per_request.profile_matches_meta_info is False:
        out.warnings.append(
            "acceptance histogram: the profile's cycles and the runs' meta_info "
            "spec_correct_drafts_histogram disagree (the profile's is used)"
        )
    return out


def decode_log_summary(lines: list[str]) -> Section:
    """The engine's own ``Decode batch`` lines inside the timed windows."""
    dl = decode_log.summarize(decode_log.parse_lines(lines))
    metrics = (
        {}
        if dl.gen_throughput_tok_s_median is None
        else {"decode_log_gen_throughput_tok_s": dl.gen_throughput_tok_s_median}
    )
    return Section({"decode_log": decode_log_from(dataclasses.asdict(dl))}, metrics)


def speedup(
    runs: Sequence[RunRecord],
    paired_runs: Sequence[RunRecord],
    pairings: list[str],
    job_runs: Sequence[RunRecord] | None,
    job_summary: Summary | None,
) -> tuple[Section, Summary | None]:
    """Speedup against the job's one baseline: per pair when its runs were interleaved with ours
    (``paired_runs``, the paired strategy), else the ratio of two independent means (Welch CI) against
    the baseline job's runs. Also returns the baseline's tok/s summary it was measured against."""
    if paired_runs and runs:
        n = min(len(runs), len(paired_runs))
        spec_tput = [r.throughput_tok_s for r in runs[:n]]
        base_tput = [r.throughput_tok_s for r in paired_runs[:n]]
        ratio, base_summary = stats.paired_ratio(spec_tput, base_tput), stats.summarize(base_tput)
        sp = Speedup.of(
            ratio,
            "paired",
            pairs=n,
            pairing=",".join(pairings) or "interleaved",
            per_pair=[x / y for x, y in zip(spec_tput, base_tput)],
        )
    elif job_runs and runs:
        ratio, base_summary = (
            stats.ratio_of_means([r.throughput_tok_s for r in runs], [r.throughput_tok_s for r in job_runs]),
            job_summary,
        )
        sp = Speedup.of(ratio, "welch")
    else:
        return Section(), None
    return Section(
        {"speedup_vs_baseline": sp},
        {
            "baseline_throughput_tok_s": base_summary.mean,
            "speedup_vs_baseline": ratio.ratio,
            "speedup_vs_baseline_ci95_lo": ratio.ci95_lo,
            "speedup_vs_baseline_ci95_hi": ratio.ci95_hi,
            "speedup_ci95_halfwidth_pct": 100 * (ratio.ci95_hi - ratio.ci95_lo) / 2 / ratio.ratio,
        },
    ), base_summary


def latency_percentiles(runs: Sequence[RunRecord]) -> Section:
    """TTFT / ITL / TPOT / E2E percentiles of the streamed timed runs (empty when none streamed)."""
    lat = latency.summarize(runs)
    return Section({"latency": lat if lat.kinds() else None}, latency.metrics_of(lat))


def server_env_section(
    live_env: dict[str, str] | None, live_env_tree: dict | None, launcher_pid: int | None, nccl: str, nccl_env: dict
) -> Section:
    """The record's ``server_env`` (filtered) from the first launch's server process, and with its whole
    tree (pid -> env) every process's (``server_env_processes``), the ranks' as ``server_env`` and what the
    engine's launcher wrote for them (``server_env_set_by_engine``). Warns when the ranks do not share one
    NCCL environment or when the ranks ran without a value the NCCL profile (``nccl``) sets."""
    out = Section({"server_env": filter_env(live_env) if live_env else None})
    if not live_env_tree:
        return out
    # Every process of the server read back. The ranks (the launcher's children) are what ran: the
    # launcher's own /proc environ misses what it wrote into os.environ before spawning them.
    ranks = rank_environment(live_env_tree, launcher_pid)
    out.fields.update(
        server_env_processes={str(pid): filter_env(env) for pid, env in live_env_tree.items()},
        server_env=ranks["env"],
        server_env_set_by_engine=ranks["set_by_engine"],
    )
    differing = {k: v for k, v in ranks["differing"].items() if k.startswith("NCCL_")}
    if differing:
        out.warnings.append(f"the server's rank processes do not share one NCCL environment: {differing}")
    for k, v in nccl_env.items():
        if ranks["env"].get(k) != str(v):
            out.warnings.append(
                f"nccl={nccl} sets {k}={v} but the server's ranks ran with {k}={ranks['env'].get(k)} "
                "(the engine's launcher rewrote it: server_env_set_by_engine)"
            )
    return out


def rank_environment(tree: dict, launcher_pid: int | None) -> dict:
    """The environment the server's ranks really ran with, from every process of its tree ({pid: env},
    read back from /proc): the launcher's children are the ranks (SGLang's schedulers, our engine's
    rank processes). A launcher that writes ``os.environ`` before it spawns them (SGLang does:
    NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE, NCCL_GRAPH_REGISTER, NCCL_ALGO under
    --enable-deterministic-inference; spec_decode.engines.sglang.ENV_WRITES) never shows those writes
    in its own /proc environ, so the launcher is not the reference.

    Returns ``env`` (the ranks' variables, filtered; the launcher's when it has no children),
    ``set_by_engine`` (filtered variables the ranks hold with another value than the launcher was
    started with: the engine's own writes) and ``differing`` ({name: {pid: value}} for variables the
    ranks themselves disagree on; empty when they agree)."""
    envs = {str(pid): filter_env(env) for pid, env in tree.items()}
    launcher = envs.get(str(launcher_pid), {})
    # A process whose environment reads back empty (a zombie, an exec with env={}) tells nothing about
    # what the ranks ran with: on real SGLang 0.5.17 at tp 1, two such children of the launcher made the
    # ranks "disagree" on every NCCL variable (docs/sglang-route.md).
    readable = {str(pid) for pid, env in tree.items() if env}
    ranks = {pid: env for pid, env in envs.items() if pid != str(launcher_pid) and pid in readable} or {
        str(launcher_pid): launcher
    }
    first = next(iter(ranks.values()), {})
    names = sorted({k for env in ranks.values() for k in env})
    differing = {
        k: {pid: env.get(k) for pid, env in ranks.items()}
        for k in names
        if len({env.get(k) for env in ranks.values()}) > 1
    }
    set_by_engine = {k: v for k, v in first.items() if launcher.get(k) != v and k not in differing}
    return {
        "env": first,
        "set_by_engine": set_by_engine if launcher_pid is not None and len(envs) > 1 else {},
        "differing": differing,
    }


def nccl_section(probe: NcclProbe | None, prov: Provenance) -> Section:
    """The NCCL probe's metrics, and its backend and library facts copied into the provenance."""
    if probe is None:
        return Section()
    return Section({"provenance": dataclasses.replace(prov, nccl=probe.facts())}, nccl_metrics(probe))


def nccl_metrics(probe: NcclProbe) -> dict[str, float]:
    """MLflow metrics: eager per-call median (``nccl_allreduce_us_<bytes>``, the name since the first
    probe) and, with NCCL, the device median (``nccl_allreduce_device_us_<bytes>``)."""
    m = {f"nccl_allreduce_us_{s}": v.median_us for s, v in probe.sizes.items()}
    m.update(
        {
            f"nccl_allreduce_device_us_{s}": d
            for s, v in probe.sizes.items()
            if (d := v.device_median_us) not in (None, ABSENT)
        }
    )
    return m
