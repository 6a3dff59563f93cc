"""Which interval survives a rerun (issue 25): the within-launch CI against the block CI, measured.

    python benchmarks/interval_design.py                       # steps=3, 8 launches x 5 pairs x 200 tokens
    python benchmarks/interval_design.py --launches 12 --tokens 500

One cell (spec + its paired baseline server, the job's own launch code and pairing) is launched
``--launches`` times one after the other; each launch: start both servers, warmup, /flush_cache,
``--pairs`` interleaved pairs (ABBA), stop. Each launch's paired speedup is what one job measures today.

- **within-launch CI** (today's job, the cheap mode): stats.paired_ratio over one launch's pairs.
  Coverage of a rerun: the share of the *other* launches' speedups that fall inside it.
- **block CI** (benchmark.block): the launches split into two interleaved halves (even / odd launches,
  so both halves span the whole run as a block-design sweep spreads its blocks); each half's interval
  is the t-CI on its launches' log speedups (n_half - 1 df, analysis.blocks.log_t_interval). Coverage
  of a rerun: the other half's geometric-mean speedup inside it (every split into two halves counted,
  not only even/odd: C(L, L/2) splits, each half once as "reported" and once as "rerun").

Prints both designs' median half-widths and coverages, and the load average before/after.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spec_decode.analysis import stats  # noqa: E402
from spec_decode.analysis.blocks import log_t_interval  # noqa: E402
from spec_decode.core.config import register_configs, to_experiment  # noqa: E402
from spec_decode.core.prompts import load_prompts  # noqa: E402
from spec_decode.engines import server_extra_env, start_server  # noqa: E402
from spec_decode.runner import pairing  # noqa: E402
from spec_decode.runner.baselines import baseline_config  # noqa: E402
from spec_decode.runner.client import Client  # noqa: E402


def one_launch(cfg, bcfg, out: Path, pairs: int, tokens: int) -> list[tuple[float, float]]:
    """(spec tok/s, base tok/s) of each pair of one launch of both servers."""
    spec = start_server(cfg, server_extra_env(cfg, None), out / "spec.server.log", any_port=True)
    try:
        base = start_server(bcfg, server_extra_env(bcfg, None), out / "baseline.server.log", any_port=True)
        try:
            clients = {"spec": Client(spec.base_url, 600), "base": Client(base.base_url, 600)}
            prompt = load_prompts(ROOT / cfg.benchmark.prompts)[cfg.benchmark.prompt_index]
            body = clients["spec"].generate_body(prompt, tokens, 0.0, True)
            expected = {arm: c.generate(body, 0, -1).wall_s for arm, c in clients.items()}
            for c in clients.values():
                c.flush_cache()
            p = pairing.Pairer(pairing.INTERLEAVED, spec.pid, base.pid, expected_s=expected)
            out_pairs = []
            for i in range(pairs):
                s, b, _ = p.run(
                    i,
                    functools.partial(clients["spec"].generate, body, 0, i),
                    functools.partial(clients["base"].generate, body, 0, i),
                )
                out_pairs.append((s.throughput_tok_s, b.throughput_tok_s))
            return out_pairs
        finally:
            base.stop()
    finally:
        spec.stop()


def analyse(launches: list[list[tuple[float, float]]]) -> dict:
    within = [stats.paired_ratio([s for s, _ in p], [b for _, b in p]) for p in launches]
    est = [r.ratio for r in within]
    hw_within = [100 * (r.ci95_hi - r.ci95_lo) / 2 / r.ratio for r in within]
    cover_within = [
        sum(r.ci95_lo <= e <= r.ci95_hi for j, e in enumerate(est) if j != i) / (len(est) - 1)
        for i, r in enumerate(within)
    ]
    n = len(est)
    half = n // 2
    hw_block, cover_block = [], []
    for idx in itertools.combinations(range(n), half):
        rest = [j for j in range(n) if j not in idx][:half]
        for rep, rerun in ((list(idx), rest), (rest, list(idx))):
            g, lo, hi = log_t_interval([est[j] for j in rep])
            g2 = log_t_interval([est[j] for j in rerun])[0]
            hw_block.append(100 * (hi - lo) / 2 / g)
            cover_block.append(lo <= g2 <= hi)
    return {
        "launch_speedups": est,
        "within_halfwidth_pct_median": statistics.median(hw_within),
        "within_rerun_coverage": statistics.fmean(cover_within),
        "block_n": half,
        "block_halfwidth_pct_median": statistics.median(hw_block),
        "block_rerun_coverage": statistics.fmean(cover_block),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--launches", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_experiment(compose("config", overrides=[f"spec.steps={args.steps}", "tracking=off"]))
    bcfg = baseline_config(cfg)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"interval_design_{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    load0, t0 = os.getloadavg(), time.time()
    launches = []
    for i in range(args.launches):
        launches.append(one_launch(cfg, bcfg, out, args.pairs, args.tokens))
        r = stats.paired_ratio([s for s, _ in launches[-1]], [b for _, b in launches[-1]])
        print(
            f"launch {i}: {r.ratio:.3f}x [{r.ci95_lo:.3f}, {r.ci95_hi:.3f}]  load {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
            flush=True,
        )
    load1 = os.getloadavg()
    res = analyse(launches)
    res.update(load1_before=load0[0], load1_after=load1[0], seconds=round(time.time() - t0), args=vars(args))
    (out / "interval_design.json").write_text(json.dumps({**res, "pairs": launches}, indent=1))
    print(
        f"steps={args.steps}, {args.launches} launches x {args.pairs} pairs x {args.tokens} tokens; load (1 min) "
        f"{load0[0]:.2f} before, {load1[0]:.2f} after; {res['seconds']} s; raw: {out / 'interval_design.json'}"
    )
    print("| design | interval from | median half-width | rerun inside the interval |")
    print("|---|---|---|---|")
    print(
        f"| within-launch (today, cheap mode) | {args.pairs} pairs of one launch, t {args.pairs - 1} df | "
        f"{res['within_halfwidth_pct_median']:.1f}% | {100 * res['within_rerun_coverage']:.0f}% |"
    )
    print(
        f"| blocks | {res['block_n']} launches spread over the run, t {res['block_n'] - 1} df | "
        f"{res['block_halfwidth_pct_median']:.1f}% | {100 * res['block_rerun_coverage']:.0f}% |"
    )
    print("launch speedups: " + " ".join(f"{e:.3f}" for e in res["launch_speedups"]))


if __name__ == "__main__":
    main()
