"""The experiments' bench commands: run an experiment's sweep (``python run.py -m experiment=<name>``, a
child process) and write its metrics.json from the records it left. Above the floors, beside run.py,
``hydra_entry`` and ``__main__``: it runs sweeps, so it is no view (``views/`` only reads records and
renders them: ``views.experiment`` report/compare/headline, ``views.drafter_experiments`` report).

    python -m spec_decode.bench experiment embedded_steps_nccl   # DVC stage bench@<name>: sweep -> metrics.json
    python -m spec_decode.bench rebuild embedded_steps_nccl      # rerun into rebuild/ (ignored by git), compare
    python -m spec_decode.bench drafters drafter_data_scaling    # DVC stage drafter_bench_*: sweep -> metrics.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from spec_decode.analysis.costmodel import fit, points_from_records
from spec_decode.core.lineage import lineage_tags
from spec_decode.record.results import JobRecord, collect
from spec_decode.views import starts as starts_view
from spec_decode.views.compare import REBUILD, committed_metrics, compare
from spec_decode.views.drafter_experiments import served_ids
from spec_decode.views.experiment import exp_dir
from spec_decode.views.metrics_json import records_from_metrics, to_metrics
from spec_decode.views.plots import write_plots
from spec_decode.views.report import sweep_summary

DRAFTER_EXPERIMENTS = ("drafter_data_scaling", "drafter_layer_ids")


def run_sweep(name: str, root: Path, sweep: Path, extra: list[str]) -> int:
    """``run.py -m experiment=<name>`` into a fresh ``sweep`` dir (a child process); its exit status."""
    if sweep.exists():
        shutil.rmtree(sweep)
    cmd = [sys.executable, str(root / "run.py"), "-m", f"experiment={name}", f"hydra.sweep.dir={sweep}", *extra]
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=root).returncode


def experiment(name: str, root: Path, extra: list[str], out: Path | None = None) -> Path:
    """The sweep into ``out`` (default: the experiment's dir, the DVC stage's committed outputs) -> metrics.json."""
    d = out or exp_dir(name, root)
    sweep = d / "sweep"
    if (code := run_sweep(name, root, sweep, extra)) != 0:
        raise SystemExit(f"bench {name}: run.py exited {code}")
    metrics = to_metrics(collect(sweep))
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    failed = [k for k, v in metrics["jobs"].items() if v["status"] != "FINISHED"]
    print(f"{len(metrics['jobs'])} jobs -> {d / 'metrics.json'}" + (f"; FAILED: {failed}" if failed else ""))
    return d / "metrics.json"


def rebuild(name: str, root: Path, extra: list[str], rev: str = "HEAD") -> bool:
    """Rerun a reported experiment into experiments/<name>/rebuild/ (sweep, metrics.json, table, plots; no
    committed file touched), then the verdict against its metrics.json at ``rev``. True if a cell differs."""
    starts_view.of_experiment(name, root)  # a broken record of starts fails here, before the sweep, not after
    out = exp_dir(name, root) / REBUILD
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    metrics = json.loads(experiment(name, root, extra, out).read_text())
    recs = records_from_metrics(metrics)
    text, _ = sweep_summary(recs)
    (out / "table.txt").write_text(text + "\n")
    plots = write_plots(recs, out)
    reported = committed_metrics(exp_dir(name, root) / "metrics.json", rev, root)
    starts = starts_view.for_compare(name, reported, metrics, root)  # the experiment's recorded starts, if any
    lines, differ = compare(reported, metrics, (f"reported ({rev})", "rebuilt"), starts)
    print("\n".join([text, "", f"rebuilt: {out} (metrics.json, table.txt, {len(plots)} plots)", "", *lines]))
    return differ


SERVED_DIR = "served"  # experiments/drafter_layer_ids/served/<ids>/: the re-labelled copies (not in git)


def sweep_params(name: str, root: Path) -> dict[str, str]:
    cfg = yaml.safe_load((root / "conf" / "experiment" / f"{name}.yaml").read_text())
    return {k: str(v) for k, v in cfg["hydra"]["sweeper"]["params"].items()}


def check_scaling_paths(root: Path) -> list[str]:
    """The experiment file's drafter paths must be the drafters params.yaml builds (one fact, checked)."""
    params = yaml.safe_load((root / "params.yaml").read_text())["build"]["drafter_scaling"]
    want = [f"models/tiny/drafter_scaling/n{n}" for n in params["samples"]]
    got = sweep_params("drafter_data_scaling", root)["drafter.path"].split(",")
    if got != want:
        raise SystemExit(
            f"conf/experiment/drafter_data_scaling.yaml: drafter.path is {got} but params.yaml "
            f"build.drafter_scaling.samples builds {want}; make them the same"
        )
    return want


def make_served_copies(root: Path) -> None:
    """Copies of models/tiny/drafter whose config.json serves other layer ids (paths from the sweep)."""
    src = root / "models" / "tiny" / "drafter"
    trained = json.loads((src / "training.json").read_text())["trained_aux_layer_ids"]
    for path in sweep_params("drafter_layer_ids", root)["drafter.path"].split(","):
        m = re.search(r"ids_(\d+)-(\d+)-(\d+)$", path)
        if not m:
            continue  # the drafter as trained
        ids = [int(x) for x in m.groups()]
        dst = root / path
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        cfg = json.loads((src / "config.json").read_text())
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        shutil.copy2(src / "model.safetensors", dst / "model.safetensors")
        note = {
            "copy_of": "models/tiny/drafter",
            "trained_aux_layer_ids": trained,
            "served_aux_layer_ids": ids,
            "why": "layer-id mismatch experiment: no training.json here, so preflight does not refuse it",
        }
        (dst / "served_as.json").write_text(json.dumps(note, indent=2) + "\n")


def training_record(path: Path, root: Path) -> dict:
    """The drafter's own training.json, or (a served copy) the original's."""
    for p in (path, root / "models" / "tiny" / "drafter"):
        if (p / "training.json").is_file():
            return json.loads((p / "training.json").read_text())
    return {}


def offline_acceptance(root: Path, ids: list[int]) -> dict:
    """Held-out acceptance of the quick start's drafter read with `ids` (no server)."""
    import torch  # lazy: the evaluation only (torch + the engine's model cost seconds)

    from spec_decode.engines.embedded.build import evaluate
    from spec_decode.engines.embedded.drafter_data import load, load_frozen_target
    from spec_decode.engines.embedded.model import load_drafter

    torch.set_num_threads(2)
    target = load_frozen_target(root / "models" / "tiny" / "target")
    drafter = load_drafter(root / "models" / "tiny" / "drafter", target)
    splits, rec = load(root / "data" / "drafter_train")
    return evaluate(drafter, target, splits["heldout"], ids, rec["prompt_tokens"])


def job_metrics(r: JobRecord) -> dict:
    """A drafter experiment's figures of one job (its metrics.json entry per step count)."""
    m, t = r.metrics, r.throughput_tok_s
    e = {"status": r.status, "throughput_tok_s": round(m.get("throughput_tok_s", float("nan")), 2)}
    for k in ("ci95_lo", "ci95_hi", "std", "n"):
        if t is not None and getattr(t, k) is not None:
            e[f"throughput_tok_s_{k}"] = round(getattr(t, k), 3)
    for k in (
        "accept_len",
        "accept_rate_draft",
        "speedup_vs_baseline",
        "speedup_vs_baseline_ci95_lo",
        "speedup_vs_baseline_ci95_hi",
        "cycle_ms",
    ):
        if k in m:
            e[k] = round(m[k], 4)
    return e


def drafters(name: str, root: Path, extra: list[str]) -> Path:
    """A drafter experiment's sweep (its served copies made first) -> its metrics.json: per drafter, the runs'
    figures per step count, held-out acceptance (training.json, or evaluated offline for a re-labelled
    copy), the cost model's best step count."""
    d = exp_dir(name, root)
    if name == "drafter_data_scaling":
        check_scaling_paths(root)
    else:
        make_served_copies(root)
    sweep = d / "sweep"
    if run_sweep(name, root, sweep, extra) != 0:
        raise SystemExit(f"bench {name}: run.py failed")
    recs = collect(sweep)
    out: dict = {"baseline": None, "drafters": {}}
    for r in recs:
        if not r.speculative:
            out["baseline"] = job_metrics(r)
            continue
        path = root / r.config["drafter"]["path"]
        rec = training_record(path, root)
        key = (
            f"n{rec['data']['samples']}"
            if name == "drafter_data_scaling"
            else "ids_" + "-".join(map(str, served_ids(path)))
        )
        entry = out["drafters"].setdefault(
            key,
            {
                "path": r.config["drafter"]["path"],
                "served_ids": served_ids(path),
                "trained_ids": rec.get("trained_aux_layer_ids"),
                "lineage": lineage_tags(path, None) or lineage_tags(root / "models" / "tiny" / "drafter", None),
                "data_samples": rec.get("data", {}).get("samples"),
                "epochs": rec.get("epochs"),
                "steps": {},
                "_recs": [],
            },
        )
        if name == "drafter_data_scaling":
            h = rec["heldout"]
            entry["heldout_accept_len"] = h["accept_len"]
            entry["heldout_accept_len_ci95"] = h["accept_len_ci95"]
        entry["steps"][str(r.steps)] = job_metrics(r)
        entry["_recs"].append(r)
    for entry in out["drafters"].values():
        recs_d = entry.pop("_recs")
        if name == "drafter_layer_ids":
            h = offline_acceptance(root, entry["served_ids"])
            entry["heldout_accept_len"], entry["heldout_accept_len_ci95"] = h["accept_len"], h["accept_len_ci95"]
            entry["heldout_top1"] = h["top1"]
        pts = points_from_records(recs_d)
        if len(pts) >= 2:
            f = fit(pts, max_steps=8)
            entry["costmodel_best_steps"] = f.best_steps
            entry["costmodel_best_tok_s"] = [round(v, 1) for v in f.best_tok_s]
    (d / "metrics.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"{len(recs)} jobs -> {d / 'metrics.json'}")
    return d / "metrics.json"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m spec_decode.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd, help_ in (
        ("experiment", "run the experiment's sweep and write metrics.json"),
        ("rebuild", f"rerun it into experiments/NAME/{REBUILD}/ (ignored by git); compare with the committed one"),
        ("drafters", "a drafter experiment's sweep -> metrics.json (drafter_data_scaling, drafter_layer_ids)"),
    ):
        p = sub.add_parser(cmd, help=help_)
        p.add_argument("name", **({"choices": DRAFTER_EXPERIMENTS} if cmd == "drafters" else {}))
        p.add_argument("overrides", nargs="*", help="extra Hydra overrides (e.g. tracking=off)")
    args = ap.parse_args(argv)
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    if not (root / "conf" / "experiment" / f"{args.name}.yaml").exists():
        ap.error(f"no experiment {args.name!r}: conf/experiment/{args.name}.yaml not found")
    if args.cmd == "experiment":
        experiment(args.name, root, args.overrides)
    elif args.cmd == "rebuild":
        raise SystemExit(1 if rebuild(args.name, root, args.overrides) else 0)
    else:
        drafters(args.name, root, args.overrides)


if __name__ == "__main__":
    main()
