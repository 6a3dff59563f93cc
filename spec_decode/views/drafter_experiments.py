"""The drafter experiments (DVC stages drafter_bench_scaling, drafter_bench_layer_ids, drafter_report@<name>):

    python -m spec_decode.bench drafters drafter_data_scaling                    # sweep -> metrics.json
    python -m spec_decode.views.drafter_experiments report drafter_data_scaling  # table into README + plot
    python -m spec_decode.bench drafters drafter_layer_ids

- drafter_data_scaling: one drafter per sample count (stage drafter_scaling@N), each served at the
  step counts of conf/experiment/drafter_data_scaling.yaml; the cost model (spec_decode.analysis.costmodel)
  fitted per drafter names its best step count.
- drafter_layer_ids: the quick start's drafter served with its trained layer ids and with two wrong
  sets. The wrong ones are copies of it whose config.json names other ids and which carry no
  training.json (the runner's preflight refuses a drafter served with ids other than it was trained
  on, as it should; the copy is how this experiment bypasses it on purpose). Each copy holds
  served_as.json saying so.

Metrics keep, per job, the runner's throughput (95% t-CI over the runs), speedup vs the baseline
(Welch CI), accept length; and from the drafter's training.json its held-out accept length (95% CI
over held-out samples), data size and hash and MLflow training run id (the lineage).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from spec_decode.core.gc_imports import frozen_imports
from spec_decode.views.experiment import BEGIN, END, exp_dir


def served_ids(path: Path) -> list[int]:
    return json.loads((path / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]


def _ci(lo: float | None, hi: float | None, spec: str = ".2f") -> str:
    return f"[{lo:{spec}}, {hi:{spec}}]" if lo is not None and hi is not None else "-"


def _ordered(metrics: dict) -> list[tuple[str, dict]]:
    """By sample count; the drafter as trained before the re-labelled copies."""
    return sorted(
        metrics["drafters"].items(),
        key=lambda kv: (kv[1].get("data_samples") or 0, kv[1]["served_ids"] != kv[1]["trained_ids"], kv[0]),
    )


def table(name: str, metrics: dict) -> str:
    base = metrics.get("baseline") or {}
    lines = [
        f"baseline: {base.get('throughput_tok_s', float('nan')):.1f} tok/s "
        f"{_ci(base.get('throughput_tok_s_ci95_lo'), base.get('throughput_tok_s_ci95_hi'), '.1f')}"
    ]
    head = "drafter" if name == "drafter_data_scaling" else "served ids"
    lines.append(
        f"{head:<16} steps  accept len  draft accept rate  held-out accept len [95% CI]  "
        "tok/s [95% CI]            speedup [95% CI]         best steps (cost model)"
    )
    for key, e in _ordered(metrics):
        for k, j in sorted(e["steps"].items(), key=lambda kv: int(kv[0])):
            h = e.get("heldout_accept_len") or []
            hci = e.get("heldout_accept_len_ci95") or []
            held = f"{h[int(k) - 1]:.2f} {_ci(*hci[int(k) - 1])}" if len(h) >= int(k) else "-"
            label = (
                key
                if name == "drafter_data_scaling"
                else (
                    ",".join(map(str, e["served_ids"])) + (" (trained)" if e["served_ids"] == e["trained_ids"] else "")
                )
            )
            best = (
                f"{e['costmodel_best_steps']} ({e['costmodel_best_tok_s'][0]:.0f} tok/s)"
                if "costmodel_best_steps" in e
                else "-"
            )
            lines.append(
                f"{label:<16} {k:>5}  {j.get('accept_len', float('nan')):10.2f}  "
                f"{j.get('accept_rate_draft', float('nan')):17.2f}  {held:<28}  "
                f"{j['throughput_tok_s']:6.1f} {_ci(j.get('throughput_tok_s_ci95_lo'), j.get('throughput_tok_s_ci95_hi'), '.1f'):<18}  "
                f"{j.get('speedup_vs_baseline', float('nan')):.3f} "
                f"{_ci(j.get('speedup_vs_baseline_ci95_lo'), j.get('speedup_vs_baseline_ci95_hi'), '.3f'):<16}  {best}"
            )
    return "\n".join(lines)


def plot(name: str, metrics: dict, path: Path) -> None:
    with frozen_imports():  # lazy: the plot only (~1 s of start-up)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    items = _ordered(metrics)
    steps = sorted({int(k) for _, e in items for k in e["steps"]})
    scaling = name == "drafter_data_scaling"
    xs = [e["data_samples"] if scaling else i for i, (_, e) in enumerate(items)]
    for k in steps:
        acc = [e["steps"].get(str(k), {}).get("accept_len", float("nan")) for _, e in items]
        held = [(e.get("heldout_accept_len") or [float("nan")] * 8)[k - 1] for _, e in items]
        ci = [(e.get("heldout_accept_len_ci95") or [[float("nan")] * 2] * 8)[k - 1] for _, e in items]
        err = [[max(0.0, h - c[0]) for h, c in zip(held, ci)], [max(0.0, c[1] - h) for h, c in zip(held, ci)]]
        line = axes[0].plot(xs, acc, "o-", label=f"served, steps={k}")[0]
        axes[0].errorbar(
            xs,
            held,
            yerr=err,
            fmt="s--",
            color=line.get_color(),
            alpha=0.6,
            capsize=3,
            label=f"held-out (offline), steps={k}",
        )
        sp = [e["steps"].get(str(k), {}) for _, e in items]
        y = [s.get("speedup_vs_baseline", float("nan")) for s in sp]
        lo = [s.get("speedup_vs_baseline_ci95_lo", v) for s, v in zip(sp, y)]
        hi = [s.get("speedup_vs_baseline_ci95_hi", v) for s, v in zip(sp, y)]
        axes[1].errorbar(
            xs,
            y,
            yerr=[[max(0.0, v - a) for v, a in zip(y, lo)], [max(0.0, b - v) for v, b in zip(y, hi)]],
            fmt="o-",
            capsize=3,
            label=f"steps={k}",
        )
    for ax, ylabel in zip(axes, ("accept length (tokens/cycle)", "speedup vs baseline (95% CI)")):
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if scaling:
            ax.set_xscale("log")
            ax.set_xlabel("training samples (prompt + target response, 640 tokens each)")
        else:
            ax.set_xticks(xs, [",".join(map(str, e["served_ids"])) for _, e in items])
            ax.set_xlabel("served layer ids (trained: " + ",".join(map(str, items[0][1]["trained_ids"])) + ")")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    fig.suptitle(name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(name: str, root: Path) -> None:
    d = exp_dir(name, root)
    metrics = json.loads((d / "metrics.json").read_text())
    text = table(name, metrics)
    (d / "table.txt").write_text(text + "\n")
    plot(name, metrics, d / f"{name}.png")
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.views.drafter_experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("cmd", choices=["report"], help="the sweep (bench) is `python -m spec_decode.bench drafters`")
    ap.add_argument("name", choices=["drafter_data_scaling", "drafter_layer_ids"])
    args = ap.parse_args(argv)
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    report(args.name, root)


if __name__ == "__main__":
    main()
