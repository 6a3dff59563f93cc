"""The views of job records: the sweep summary, experiment metrics (keyed by override set), the report
rebuilt from metrics.json, compare's verdicts, generated facts; and the import graph has no cycle."""

import ast
import json
from pathlib import Path

import pytest

from spec_decode.record.results import Check, EngineInfo, JobRecord
from spec_decode.record.sections import Summary
from spec_decode.views import experiment, metrics_json, plots, report

pytestmark = pytest.mark.unit
PKG = Path(__file__).resolve().parents[2] / "spec_decode"


def job(
    name: str,
    steps: int | None,
    tput: float,
    nccl: str = "default",
    status: str = "FINISHED",
    error: str | None = None,
    **metrics,
) -> JobRecord:
    spec = steps is not None
    m = (
        {
            "throughput_tok_s": tput,
            "throughput_tok_s_ci95_lo": tput - 10,
            "throughput_tok_s_ci95_hi": tput + 10,
            "throughput_tok_s_cv": 0.02,
            **metrics,
        }
        if status == "FINISHED"
        else {}
    )
    if spec and status == "FINISHED":
        m.update(
            {
                "accept_len": 1.0 + 0.9 * steps,
                "cycle_ms": 4.0 + steps,
                "draft_ms": 0.5 * steps,
                "verify_ms": 3.0 + 0.1 * (steps + 1),
                "extend_ms": 1.0,
                "other_ms": 0.0,
                "draft_pct": 10.0,
                "verify_pct": 70.0,
                "extend_pct": 20.0,
                "other_pct": 0.0,
            }
        )
    return JobRecord(
        role="spec" if spec else "baseline",
        name=name,
        experiment="e",
        config={
            "nccl": {"name": nccl},
            "spec": {"steps": steps},
            "hardware": {"name": "cpu"},
            "model": {"name": "tiny_llama"},
            "engine": {"name": "embedded"},
            "drafter": {"name": "tiny_eagle3" if spec else "none"},
        },
        config_hash="h",
        engine=EngineInfo("embedded"),
        speculative=spec,
        status=status,
        error=error,
        metrics=m,
        throughput_tok_s=Summary(n=5, mean=tput, std=5.0, cv=0.02, ci95_lo=tput - 10, ci95_hi=tput + 10) if m else None,
        out_dir=f"/s/{name}",
        checks=[Check("phases_within_cycle", steps != 3, 1.1, "", "")] if steps in (1, 3) else [],
    )


def sweep() -> list[JobRecord]:
    return [
        job("baseline,nccl=default", None, 300.0),
        job(
            "nccl=default,spec.steps=1",
            1,
            360.0,
            speedup_vs_baseline=1.2,
            speedup_vs_baseline_ci95_lo=1.1,
            speedup_vs_baseline_ci95_hi=1.3,
        ),
        job(
            "nccl=default,spec.steps=3",
            3,
            480.0,
            speedup_vs_baseline=1.6,
            speedup_vs_baseline_ci95_lo=1.5,
            speedup_vs_baseline_ci95_hi=1.7,
        ),
        job(
            "nccl=default,spec.steps=9",
            9,
            0.0,
            status="FAILED",
            error="preflight failed:\n  - benchmark.prompt_index=99: prompts.jsonl has 8 prompts (0..7)",
        ),
    ]


def test_sweep_summary_counts_statuses_and_names_each_failure():
    text, table = report.sweep_summary(sweep())
    assert "4 job(s): 1 FAILED, 3 FINISHED" in text
    assert "  FAILED nccl=default,spec.steps=9: benchmark.prompt_index=99: prompts.jsonl has 8 prompts (0..7)" in text
    assert table["job"] == [r.name for r in sweep()]
    assert table["speedup 95% CI"][1] == "[1.100, 1.300]" and table["checks"][2] == "FAILED: phases_within_cycle"
    assert table["tok/s"][3] == "-" and table["checks"][0] == "-" and table["checks"][1] == "ok"


def test_metrics_are_keyed_by_override_set_and_a_shared_key_is_refused():
    recs = [
        job("benchmark.prompt_index=0,spec.steps=1", 1, 360.0),
        job("benchmark.prompt_index=1,spec.steps=1", 1, 350.0),
    ]
    m = metrics_json.to_metrics(recs)
    assert set(m["jobs"]) == {"benchmark.prompt_index=0,spec.steps=1", "benchmark.prompt_index=1,spec.steps=1"}
    assert m["jobs"]["benchmark.prompt_index=1,spec.steps=1"]["throughput_tok_s"] == 350.0
    with pytest.raises(ValueError, match="two jobs share the metrics key"):
        metrics_json.to_metrics([recs[0], recs[0]])


def test_report_from_metrics_json_equals_the_report_from_the_records():
    recs = sweep()[::-1]  # a sweep order that is not the keys' alphabetical order
    metrics = json.loads(json.dumps(metrics_json.to_metrics(recs)))  # as committed
    back = metrics_json.records_from_metrics(metrics)
    assert [r.name for r in back] == [r.name for r in recs]  # sweep order kept
    assert report.sweep_summary(back)[0] == report.sweep_summary(recs)[0]
    assert sorted(plots.figures(back)) == [
        "accept_len_vs_steps.png",
        "phases.png",
        "speedup_vs_steps.png",
        "throughput_vs_steps.png",
    ]


def test_a_plot_without_data_says_so_instead_of_leaving_an_earlier_sweeps_plot(tmp_path):
    """A sweep without a profiled pass has no phases: the experiment's phases.png (a DVC out of the report
    stage) must not stay the earlier sweep's plot beside the new numbers, nor go missing."""
    recs = sweep()
    for r in recs:
        for k in ("cycle_ms", "draft_ms", "verify_ms", "extend_ms", "other_ms"):
            r.metrics.pop(k, None)
    assert "phases.png" not in plots.figures(recs)
    stale = tmp_path / "phases.png"
    stale.write_bytes(b"an earlier sweep's phase plot")
    written = {p.name for p in plots.write_plots(recs, tmp_path)}
    assert set(plots.ALWAYS) <= written
    assert stale.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema1_metrics_json_still_renders():
    old = {
        "jobs": {
            "baseline,nccl=default": {"engine": "embedded", "status": "FINISHED", "throughput_tok_s": 300.0},
            "nccl=default,spec.steps=2": {
                "engine": "embedded",
                "status": "FINISHED",
                "throughput_tok_s": 450.0,
                "accept_len": 2.8,
                "cycle_ms": 6.0,
            },
        }
    }
    recs = metrics_json.records_from_metrics(old)
    assert [(r.role, r.steps, r.choice("nccl")) for r in recs] == [
        ("baseline", None, "default"),
        ("spec", 2, "default"),
    ]
    text, table = report.sweep_summary(recs)
    assert "2 job(s): 2 FINISHED" in text
    assert table["checks"] == ["-", "-"]  # schema 1 kept no checks: not labelled "ok"
    assert recs[1].metrics.get("draft_pct") is None  # no ms in this entry: no share invented


def test_facts_are_the_numbers_of_the_metrics():
    recs = sweep()
    lines = experiment.facts(metrics_json.to_metrics(recs))
    assert (
        "- `nccl=default` speedup vs its baseline (95% CI): 1.20x [1.10, 1.30] at 1, 1.60x [1.50, 1.70] at 3 steps"
        in lines
    )
    assert "- `nccl=default` best measured: 3 steps at 480.0 tok/s [470.0, 490.0]" in lines
    # verify = 3.0 + 0.1 x tokens by construction; draft = 0.5 x steps
    assert (
        "- `nccl=default` verify = 3.00 + 0.100 ms per verified token; draft = 0.00 + 0.500 ms per step "
        "(least squares with costs >= 0 over 2 jobs; R^2 1.00 / 1.00)" in lines
    )
    assert "- accept length 1.90 / 3.70 at 1 / 3 steps" in lines
    assert "- 2 of 2 spec jobs have a speedup whose 95% CI lies above 1.0" in lines
    assert (
        "- 4 jobs, 3 finished; 1 of the 2 checked pass every consistency check (failed: phases_within_cycle)" in lines
    )


def _imports(path: Path, module: str) -> set[str]:
    """spec_decode modules imported anywhere in a file (also inside functions), except under
    ``if TYPE_CHECKING:`` and ``if __name__ == "__main__":`` (that block runs only when the file is the
    program, as a separate ``__main__`` module, so what it imports cannot close a cycle on import)."""
    tree = ast.parse(path.read_text())

    def skipped(test: ast.expr) -> bool:
        if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            return True
        return (
            isinstance(test, ast.Compare)
            and getattr(test.left, "id", None) == "__name__"
            and any(getattr(c, "value", None) == "__main__" for c in test.comparators)
        )

    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and skipped(node.test) for n in ast.walk(node)}
    pkg = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [f"{target}.{a.name}" for a in node.names]
            out.update(n for n in [target, *names] if n.startswith("spec_decode"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("spec_decode"))
    return out


def test_the_import_graph_has_no_cycle():
    modules = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {m: {i for i in _imports(f, m) if i in modules and i != m} for m, f in modules.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n) :] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert "spec_decode.views.tracking" not in graph["spec_decode.record.results"]
    assert "spec_decode.core.store" in graph["spec_decode.views.report"]  # report -> the store rule (--mlflow-run)
    assert "spec_decode.views.report" not in graph["spec_decode.views.tracking"]
