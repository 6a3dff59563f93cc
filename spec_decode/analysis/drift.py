"""Drift guard: is this baseline like the earlier baselines of the same setup?

The job (not a view) runs it before results.json is written, with or without MLflow: the earlier
baselines come from the MLflow store when tracking is on (``tracking.Tracker.earlier_baselines``), else
from the results.json files under ``tracking.results_dirs`` (``runner.baselines.earlier_baselines``).
A baseline is measured either by a baseline job (``benchmark.paired=false``) or by the paired baseline
server of a spec job (the default): both are references, and both are checked (the paired job's
baseline arm: ``baseline_throughput_tok_s``). Earlier FINISHED baselines with the same identity
(hardware, tp size, model, engine and protocol: tokens, prompt set, prompt) are the reference. The NCCL
profile is not part of the identity: the seed's incident is this key measured again with other NCCL
settings (88.8 -> 62.9 tok/s after the variables were lost), so a run with another profile than the
newest earlier one is a finding ("nccl=tuned in the earlier runs, nccl=default now; NCCL_PROTO was LL
in the earlier runs, unset now"). A sweep that varies ``nccl`` compares each profile with its own
history only (the caller filters: ``runner.baselines``). Findings, each a visible warning naming what
differs in provenance:

- what differs from the newest earlier run: the NCCL profile and the live server environment (the
  source story: NCCL variables lost after a restart), the hashes of the target and the data (target,
  prompts; the baseline runs no drafter), the engine version -- flagged even when throughput looks normal;
- the throughput outside the 95% prediction interval of the earlier runs of the same NCCL profile and
  the same kind (paired arm or baseline job), for a new job mean
  (mean +- t(0.975, n-1) * sd * sqrt(1 + 1/n) over n >= MIN_EARLIER earlier job means). With fewer,
  there is no interval alarm: one or two earlier points on a machine whose runs differ by +-25% are
  no evidence; the finding says "too few earlier baselines" instead.

Pure functions: no MLflow, no files.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from spec_decode.analysis.stats import t_ppf
from spec_decode.record.provenance import Provenance
from spec_decode.record.results import Drift

ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_")
# Set for the spec server only (forced acceptance): no difference when a paired spec job's environment
# is compared with a baseline job's.
SPEC_ONLY_ENV = ("SGLANG_SIMULATE_ACC_",)
# Inputs the baseline never reads: another drafter is another experiment, not drift.
NOT_BASELINE_INPUTS = ("drafter",)
# Earlier baselines needed before an interval can raise an alarm: with 2 points the t-interval's
# t(0.975, 1) = 12.7 makes it meaningless, and one point's CI says nothing about launch-to-launch spread.
MIN_EARLIER = 3


@dataclass
class Reference:
    """One earlier baseline job."""

    run_id: str  # MLflow run id or the record id
    throughput_tok_s: float
    started_at: float = 0.0
    ci95: tuple[float, float] | None = None
    server_env: dict[str, str] = field(default_factory=dict)
    data_hashes: dict[str, str] = field(default_factory=dict)  # target/drafter/prompts -> hash
    engine_version: str | None = None
    nccl: str | None = None  # its NCCL profile (the nccl group's choice)
    paired: bool = False  # the baseline arm of a paired spec job (else a baseline job)


# The serving options and the load a user chooses: each changes a baseline's speed by design, so another
# value is another setup, not drift (on the H200, 2026-12-04, baselines with the overlap scheduler off
# were reported "DRIFT ... no provenance difference found" against the overlap-on ones, 1975 vs 2341-2514
# tok/s). Keys an engine's config lacks (SGLang has no disable_overlap_schedule: its flags are extra_args)
# are left out.
ENGINE_OPTIONS = (
    "disable_overlap_schedule",
    "cuda_eager_batching",
    "cuda_graph_max_bs_decode",
    "torch_compile",
    "proj_split",
    "max_running_requests",
    "extra_args",
)
# Options added after records existed: at this value (their default, the behaviour from before) they are
# left out of the identity, so a record from before the option still matches one that carries it.
ADDED_DEFAULTS = {"proj_split": 0}
LOAD_OPTIONS = ("concurrency", "request_rate", "load", "load_prompts", "stream", "temperature", "ignore_eos")


def identity(config: dict) -> dict[str, object]:
    """What two baselines must share to be compared (throughput depends on the protocol, the serving
    options and the load too). The engine version, the weights and the NCCL profile are not part of it: a
    change there is a finding (the seed's incident: the same key with other NCCL settings), not a new
    setup. Values as the record holds them (``extra_args`` a list)."""
    b, e = config["benchmark"], config["engine"]
    out = {
        "hardware": config["hardware"]["name"],
        "hardware.tp_size": config["hardware"].get("tp_size", 1),
        "model": config["model"]["name"],
        "engine": e["name"],
        "benchmark.max_new_tokens": b["max_new_tokens"],
        "benchmark.prompts": b["prompts"],
        "benchmark.prompt_index": b["prompt_index"],
    }
    out.update({f"engine.{k}": e[k] for k in ENGINE_OPTIONS if k in e and e[k] != ADDED_DEFAULTS.get(k, ...)})
    out.update({f"benchmark.{k}": b[k] for k in LOAD_OPTIONS if k in b})
    return out


def data_hashes_of(provenance: Provenance) -> dict[str, str]:
    """{input name: hash} from a record's provenance (its ``data``: ``runner.provenance.data_hashes``)."""
    out = {}
    for name, h in (provenance.data or {}).items():
        out[name] = str(h.get("dvc_md5") or h.get("sha256") or "missing")
    return out


def interval(means: list[float]) -> tuple[float, float] | None:
    """95% prediction interval for a new job mean; None with fewer than MIN_EARLIER means."""
    if len(means) < MIN_EARLIER:
        return None
    m, sd, n = statistics.fmean(means), statistics.stdev(means), len(means)
    half = t_ppf(0.975, n - 1) * sd * math.sqrt(1 + 1 / n)
    return m - half, m + half


def env_differences(earlier: dict[str, str], now: dict[str, str], same_kind: bool = True) -> list[str]:
    """``same_kind``: both environments are of one server kind (else the spec server's own variables,
    SPEC_ONLY_ENV, are not compared)."""
    out = []
    for k in sorted(set(earlier) | set(now)):
        if not k.startswith(ENV_PREFIXES) or (not same_kind and k.startswith(SPEC_ONLY_ENV)):
            continue
        a, b = earlier.get(k), now.get(k)
        if a != b:
            was = f"was {a}" if a is not None else "was unset"
            is_ = f"{b} now" if b is not None else "unset now"
            out.append(f"{k} {was} in the earlier runs, {is_}")
    return out


def provenance_differences(ref: Reference, data_hashes: dict[str, str], engine_version: str | None) -> list[str]:
    """Weight/data hashes and engine version: what differs from the earlier run ``ref``."""
    out = []  # only what both sides know: an older record without hashes is no evidence of a change
    for name in sorted(set(ref.data_hashes) & set(data_hashes) - set(NOT_BASELINE_INPUTS)):
        a, b = ref.data_hashes[name], data_hashes[name]
        if a != b:
            out.append(f"{name} hash was {a[:12]} in the earlier runs, {b[:12]} now")
    if ref.engine_version and engine_version and ref.engine_version != engine_version:
        out.append(f"engine version was {ref.engine_version} in the earlier runs, {engine_version} now")
    return out


def check(
    throughput_tok_s: float,
    server_env: dict[str, str],
    earlier: list[Reference],
    data_hashes: dict[str, str] | None = None,
    engine_version: str | None = None,
    nccl: str | None = None,
    paired: bool = False,
) -> Drift | None:
    """Compare a finished baseline with earlier ones; None when there is nothing to compare.

    ``data_hashes`` / ``engine_version`` / ``nccl`` (the NCCL profile): this baseline's
    (``data_hashes_of``); compared with the newest earlier run's, like the server environment.
    ``paired``: the baseline arm of a paired spec job. The interval takes the earlier runs of the same
    NCCL profile and kind only."""
    if not earlier:
        return None
    earlier = sorted(earlier, key=lambda r: r.started_at, reverse=True)  # newest first
    ref = earlier[0]
    diffs = env_differences(ref.server_env, server_env, same_kind=ref.paired == paired)
    if ref.nccl and nccl and ref.nccl != nccl:
        diffs.insert(0, f"nccl={ref.nccl} in the earlier runs, nccl={nccl} now")
    prov = provenance_differences(ref, data_hashes or {}, engine_version)
    like = [r for r in earlier if (r.nccl is None or nccl is None or r.nccl == nccl) and r.paired == paired]
    iv = interval([r.throughput_tok_s for r in like])
    outside = iv is not None and not (iv[0] <= throughput_tok_s <= iv[1])
    finding = Drift(
        earlier_runs=len(earlier),
        earlier_run_ids=[r.run_id for r in earlier[:10]],
        interval_tok_s=list(iv) if iv else None,
        throughput_tok_s=throughput_tok_s,
        outside_interval=outside,
        env_differences=diffs,
        provenance_differences=prov,
    )
    if iv is None:
        finding.note = (
            f"too few earlier baselines ({len(like)} < {MIN_EARLIER}) of this NCCL profile and kind for an "
            "interval: no throughput alarm yet"
        )
    found = diffs + prov
    if outside or found:
        what = (
            f"baseline {throughput_tok_s:.1f} tok/s is outside the {len(like)} earlier baselines' "
            f"interval [{iv[0]:.1f}, {iv[1]:.1f}]"
            if outside and iv
            else f"baseline throughput {throughput_tok_s:.1f} tok/s "
            + ("looks normal" if iv else "has no interval to compare with (too few earlier baselines)")
            + ", but the provenance changed"
        )
        finding.message = (
            "DRIFT: " + what + (" -- " + "; ".join(found) if found else " -- no provenance difference found")
        )
    return finding
