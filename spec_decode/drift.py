"""Drift guard: is this baseline like the earlier baselines of the same setup?

After a baseline job, earlier FINISHED baseline runs in MLflow with the same hardware, model, engine,
engine version, NCCL profile and protocol (tokens, prompt) are the reference. Two findings, each a visible warning naming what
differs in provenance (e.g. "NCCL_PROTO was LL in the earlier runs, unset now"):

- the live server environment differs from the earlier runs' for the same profile (the source
  story: NCCL variables lost after a restart) -- flagged even when throughput looks normal;
- the throughput falls outside the earlier runs' 95% prediction interval for a new job mean
  (mean +- t(0.975, n-1) * sd * sqrt(1 + 1/n) over n >= 2 earlier job means; with one earlier run,
  its own 95% CI).
"""

from __future__ import annotations

import math
import statistics

from scipy import stats as st

ENV_PARAM = "server_env."


def interval(means: list[float], single_ci: tuple[float, float] | None = None) -> tuple[float, float] | None:
    if len(means) >= 2:
        m, sd, n = statistics.fmean(means), statistics.stdev(means), len(means)
        half = st.t.ppf(0.975, n - 1) * sd * math.sqrt(1 + 1 / n)
        return m - half, m + half
    return single_ci


def env_differences(earlier: dict[str, str], now: dict[str, str]) -> list[str]:
    out = []
    for k in sorted(set(earlier) | set(now)):
        if not k.startswith("NCCL_") and not k.startswith("SGLANG_") and not k.startswith("CUDA_"):
            continue
        a, b = earlier.get(k), now.get(k)
        if a != b:
            was = f"was {a}" if a is not None else "was unset"
            is_ = f"{b} now" if b is not None else "unset now"
            out.append(f"{k} {was} in the earlier runs, {is_}")
    return out


def check(rec: dict, client, experiment_id: str) -> dict | None:
    """Compare a finished baseline record with earlier ones in MLflow; returns the finding (also
    appended to rec['warnings'] and stored as rec['drift']) or None when there is nothing to compare."""
    if rec.get("role") != "baseline" or rec.get("status") != "FINISHED" or not rec.get("metrics"):
        return None
    conf = rec["config"]
    filt = " and ".join([
        "params.role = 'baseline'", "attributes.status = 'FINISHED'",
        f"params.hardware = '{conf['hardware']['name']}'", f"params.model = '{conf['model']['name']}'",
        f"params.engine = '{conf['engine']['name']}'", f"params.nccl = '{conf['nccl']['name']}'",
        f"tags.`engine.version` = '{rec['engine'].get('version')}'",
        # throughput depends on the protocol too: compare like with like
        f"params.`benchmark.max_new_tokens` = '{conf['benchmark']['max_new_tokens']}'",
        f"params.`benchmark.prompts` = '{conf['benchmark']['prompts']}'",
        f"params.`benchmark.prompt_index` = '{conf['benchmark']['prompt_index']}'",
    ])
    earlier = [r for r in client.search_runs([experiment_id], filt, max_results=50)
               if r.info.run_id != rec.get("mlflow_run_id") and "throughput_tok_s" in r.data.metrics]
    if not earlier:
        return None
    now_env = rec.get("server_env") or {}
    ref = earlier[0]  # newest first
    ref_env = {k[len(ENV_PARAM):]: v for k, v in ref.data.params.items() if k.startswith(ENV_PARAM)}
    diffs = env_differences(ref_env, now_env)
    means = [r.data.metrics["throughput_tok_s"] for r in earlier]
    single = None
    if len(means) == 1:
        m = ref.data.metrics
        if "throughput_tok_s_ci95_lo" in m:
            single = (m["throughput_tok_s_ci95_lo"], m["throughput_tok_s_ci95_hi"])
    iv = interval(means, single)
    tput = rec["metrics"]["throughput_tok_s"]
    outside = iv is not None and not (iv[0] <= tput <= iv[1])
    finding = {
        "earlier_runs": len(earlier), "earlier_run_ids": [r.info.run_id for r in earlier[:10]],
        "interval_tok_s": list(iv) if iv else None, "throughput_tok_s": tput,
        "outside_interval": outside, "env_differences": diffs,
    }
    rec["drift"] = finding
    if outside or diffs:
        what = (f"baseline {tput:.1f} tok/s is outside the {len(earlier)} earlier baseline(s)' interval "
                f"[{iv[0]:.1f}, {iv[1]:.1f}]" if outside else
                f"baseline throughput {tput:.1f} tok/s looks normal, but the server environment changed")
        msg = "DRIFT: " + what + (" -- " + "; ".join(diffs) if diffs else " -- no provenance difference found")
        rec["warnings"].append(msg)
        finding["message"] = msg
    return finding
