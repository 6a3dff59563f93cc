"""Measured per-position acceptance vs the cost model's fitted decay, from a steps sweep's records.

    python run.py -m spec.steps=1,2,3,5 tracking=off benchmark.baseline_arm=false hydra.sweep.dir=/tmp/acc
    python benchmarks/acceptance_vs_fit.py /tmp/acc [--nccl default]

Prints (1) the acceptance rate at each draft position measured at every step count next to the fitted
alpha x decay^(i-1) (least squares on the accept lengths, what the cost model used before it read the
measured rates) and (2) the accept length each step count measured vs what the fit and the rates
measured at the largest step count predict for it. The accept length here is from the histogram
(tokens committed per verify); meta_info's completion / verify is also shown (it counts the prefill's
token and stops at max_new_tokens, so it reads slightly lower at long chains).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tabulate import tabulate

from spec_decode.analysis import acceptance
from spec_decode.analysis.costmodel import chain_accept_len, fit, fitted_rate, points_from_records
from spec_decode.record import results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--nccl", default=None, help="only this NCCL profile's jobs")
    args = ap.parse_args(argv)
    recs = [
        r
        for r in results.collect(args.sweep)
        if r.speculative and r.status == "FINISHED" and (args.nccl is None or r.choice("nccl") == args.nccl)
    ]
    have = sorted((r for r in recs if r.acceptance and r.acceptance.per_position), key=lambda r: r.steps)
    if not have:
        raise SystemExit(f"{args.sweep}: no finished spec job with per-position acceptance (issue 21 records)")
    f = fit(points_from_records(recs, nccl=args.nccl), max_steps=max(r.steps for r in have))
    depth = max(r.steps for r in have)
    rows = []
    for i in range(1, depth + 1):
        measured = {r.steps: r.acceptance.per_position[i - 1] for r in have if r.steps >= i}
        deepest = measured.get(f.rates_steps)
        rows.append(
            [
                i,
                *(
                    f"{measured[r.steps]:.3f}" if r.steps in measured and measured[r.steps] is not None else "-"
                    for r in have
                ),
                f"{fitted_rate(f, i):.3f}",
                f"{fitted_rate(f, i) - deepest:+.3f}" if deepest is not None else "-",
            ]
        )
    print(
        f"acceptance rate at draft position i, P(accepted >= i | accepted >= i-1); fit: {f.alpha:.3f} x "
        f"{f.decay:.3f}^(i-1) (least squares on {f.n} accept lengths)"
    )
    print(
        tabulate(
            rows,
            headers=[
                "position",
                *(f"measured @ steps={r.steps}" for r in have),
                "fit",
                f"fit - measured @ steps={f.rates_steps}",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    print()
    rows = []
    for r in have:
        hist = r.acceptance.histogram
        from_hist = acceptance.accept_len_from_rates(r.acceptance.per_position)
        from_fit = chain_accept_len(f.alpha, r.steps, f.decay)
        from_rates = acceptance.accept_len_from_rates(f.accept_rates[: r.steps])
        rows.append(
            [
                r.steps,
                sum(hist),
                f"{from_hist:.3f}",
                f"{r.metrics['accept_len']:.3f}",
                f"{from_fit:.3f} ({from_fit - from_hist:+.3f})",
                f"{from_rates:.3f} ({from_rates - from_hist:+.3f})",
            ]
        )
    print("accept length (tokens per verify, bonus included) per step count")
    print(
        tabulate(
            rows,
            headers=[
                "steps",
                "verifies",
                "measured (histogram)",
                "meta_info completion/verify",
                "fit (error)",
                f"rates @ steps={f.rates_steps} (error)",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )


if __name__ == "__main__":
    main()
