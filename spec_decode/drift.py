"""Drift guard: is this baseline like the earlier baselines of the same setup?

The job (not a view) runs it before results.json is written, with or without MLflow: the earlier
baselines come from the MLflow store when tracking is on (``tracking.Tracker.earlier_baselines``), else
from the results.json files under ``tracking.results_dirs`` (``references_from_records``). Earlier
FINISHED baselines with the same identity (hardware, model, engine, engine version, NCCL profile and
protocol: tokens, prompt set, prompt) are the reference. Two findings, each a visible warning naming
what differs in provenance (e.g. "NCCL_PROTO was LL in the earlier runs, unset now"):

- the live server environment differs from the newest earlier run's for the same profile (the source
  story: NCCL variables lost after a restart) -- flagged even when throughput looks normal;
- the throughput falls outside the earlier runs' 95% prediction interval for a new job mean
  (mean +- t(0.975, n-1) * sd * sqrt(1 + 1/n) over n >= 2 earlier job means; with one earlier run,
  its own 95% CI).

Pure functions: no MLflow, no files.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from scipy import stats as st

ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_")


@dataclass
class Reference:
    """One earlier baseline job."""

    run_id: str  # MLflow run id or the record id
    throughput_tok_s: float
    started_at: float = 0.0
    ci95: tuple[float, float] | None = None
    server_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Drift:
    earlier_runs: int
    earlier_run_ids: list[str]
    interval_tok_s: list[float] | None
    throughput_tok_s: float
    outside_interval: bool
    env_differences: list[str]
    message: str | None = None  # set when there is something to warn about

    def as_dict(self) -> dict:
        return asdict(self)


def identity(config: dict, engine_version: str | None) -> dict[str, object]:
    """What two baselines must share to be compared (throughput depends on the protocol too)."""
    b = config["benchmark"]
    return {"hardware": config["hardware"]["name"], "model": config["model"]["name"],
            "engine": config["engine"]["name"], "nccl": config["nccl"]["name"],
            "engine.version": engine_version, "benchmark.max_new_tokens": b["max_new_tokens"],
            "benchmark.prompts": b["prompts"], "benchmark.prompt_index": b["prompt_index"]}


def interval(means: list[float], single_ci: tuple[float, float] | None = None) -> tuple[float, float] | None:
    if len(means) >= 2:
        m, sd, n = statistics.fmean(means), statistics.stdev(means), len(means)
        half = st.t.ppf(0.975, n - 1) * sd * math.sqrt(1 + 1 / n)
        return m - half, m + half
    return single_ci


def env_differences(earlier: dict[str, str], now: dict[str, str]) -> list[str]:
    out = []
    for k in sorted(set(earlier) | set(now)):
        if not k.startswith(ENV_PREFIXES):
            continue
        a, b = earlier.get(k), now.get(k)
        if a != b:
            was = f"was {a}" if a is not None else "was unset"
            is_ = f"{b} now" if b is not None else "unset now"
            out.append(f"{k} {was} in the earlier runs, {is_}")
    return out


def check(throughput_tok_s: float, server_env: dict[str, str], earlier: list[Reference]) -> Drift | None:
    """Compare a finished baseline with earlier ones; None when there is nothing to compare."""
    if not earlier:
        return None
    earlier = sorted(earlier, key=lambda r: r.started_at, reverse=True)  # newest first
    ref = earlier[0]
    diffs = env_differences(ref.server_env, server_env)
    means = [r.throughput_tok_s for r in earlier]
    iv = interval(means, ref.ci95 if len(means) == 1 else None)
    outside = iv is not None and not (iv[0] <= throughput_tok_s <= iv[1])
    finding = Drift(earlier_runs=len(earlier), earlier_run_ids=[r.run_id for r in earlier[:10]],
                    interval_tok_s=list(iv) if iv else None, throughput_tok_s=throughput_tok_s,
                    outside_interval=outside, env_differences=diffs)
    if outside or diffs:
        assert iv is not None or not outside
        what = (f"baseline {throughput_tok_s:.1f} tok/s is outside the {len(earlier)} earlier baseline(s)' "
                f"interval [{iv[0]:.1f}, {iv[1]:.1f}]" if outside and iv else
                f"baseline throughput {throughput_tok_s:.1f} tok/s looks normal, but the server environment changed")
        finding.message = "DRIFT: " + what + (" -- " + "; ".join(diffs) if diffs
                                              else " -- no provenance difference found")
    return finding
