"""The typed job record: analysis.finish computes from real files, one write, schema-1 records still read,
the profile windows, and the drift guard's findings."""

import json
from pathlib import Path

import pytest

from spec_decode.analysis import drift
from spec_decode.analysis.finish import Measured, add_drift, finish
from spec_decode.engines.engine import engine_of
from spec_decode.parsers import profile
from spec_decode.record import results
from spec_decode.record.results import JobRecord
from spec_decode.record.sections import Profile, Summary
from spec_decode.runner.client import RunRecord
from spec_decode.runner.context import JobContext, new_record

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


experiment = compose_experiment


def new(tmp_path: Path, *overrides: str, role: str = "spec") -> tuple:
    cfg = experiment(*overrides)
    rec = new_record(cfg, JobContext(out_dir=tmp_path, run_name="spec.steps=2", root=ROOT), role, {}, [])
    return cfg, rec


def run(i: int, tokens: int, wall_s: float, verify_ct: int | None, t0: float) -> RunRecord:
    return RunRecord(
        launch=0,
        run=i,
        start_wall=t0,
        end_wall=t0 + wall_s,
        wall_s=wall_s,
        prompt_tokens=10,
        completion_tokens=tokens,
        e2e_latency_s=wall_s * 0.99,
        spec_verify_ct=verify_ct,
        spec_num_correct_drafts=None if verify_ct is None else tokens - verify_ct,
        spec_num_proposed_drafts=None if verify_ct is None else 2 * verify_ct,
    )


def test_finish_computes_every_figure_from_the_runs_profile_and_log(tmp_path):
    cfg, rec = new(tmp_path)
    # two runs of 100 tokens in 40 verifies each: 0.25 s and 0.20 s
    rec.runs = [run(0, 100, 0.25, 40, 1000.0), run(1, 100, 0.20, 40, 2000.0)]
    # rank 0's profile: 40 cycles of 5 ms inside each run's window, and 7 cycles outside every window
    lines = [
        {
            "t": t0 + 0.005 * (k + 1),
            "rank": 0,
            "draft_ms": 1.0,
            "verify_ms": 3.0,
            "extend_ms": 0.5,
            "cycle_ms": 5.0,
            "accepted": 2.5,
        }
        for t0 in (1000.0, 2000.0)
        for k in range(40)
    ]
    lines += [
        {
            "t": 3000.0 + k,
            "rank": 0,
            "draft_ms": 9.0,
            "verify_ms": 9.0,
            "extend_ms": 9.0,
            "cycle_ms": 50.0,
            "accepted": 1,
        }
        for k in range(7)
    ]
    (tmp_path / "profile.rank0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    log = tmp_path / "server.log"
    before = "[2026-11-29 10:00:00] Decode batch, #running-req: 1, accept len: 9.00, gen throughput (token/s): 1.00\n"
    inside = "".join(
        f"[2026-11-29 10:00:0{i}] Decode batch, #running-req: 1, #token: 50, accept len: 2.50, "
        f"gen throughput (token/s): {v:.2f}\n"
        for i, v in enumerate((400.0, 500.0, 600.0))
    )
    log.write_text(before + inside)
    base = JobRecord(
        role="baseline",
        name="baseline",
        experiment="x",
        config={},
        config_hash="",
        engine=results.EngineInfo("embedded"),
        speculative=False,
        status="FINISHED",
        runs=[run(0, 100, 0.5, None, 0.0), run(1, 100, 0.5, None, 1.0)],
        throughput_tok_s=Summary(mean=200.0),
        out_dir="/b",
    )

    finish(
        rec,
        cfg,
        "FINISHED",
        None,
        Measured(tmp_path, log, [(len(before), len(before) + len(inside))]),
        base,
        engine_of(cfg),
    )

    m = rec.metrics
    assert m["throughput_tok_s"] == pytest.approx((400 + 500) / 2)
    assert m["accept_len"] == pytest.approx(200 / 80)
    assert rec.profile.cycles == 80  # the 7 cycles outside the windows are left out
    assert (m["cycle_ms"], m["draft_ms"], m["verify_ms"], m["extend_ms"]) == pytest.approx((5.0, 1.0, 3.0, 0.5))
    assert m["other_ms"] == pytest.approx(0.5) and m["verify_pct"] == pytest.approx(60.0)
    assert rec.profile.complete is True  # 80 cycles == 80 verifies
    # 250 ms and 200 ms requests, 40 cycles x 5 ms = 200 ms inside the cycles each
    assert rec.profile.non_cycle_ms_per_request == pytest.approx((50 + 0) / 2)
    # only the window's lines, and its first line (after idle) dropped: median of 500 and 600
    assert m["decode_log_gen_throughput_tok_s"] == 550.0
    assert m["speedup_vs_baseline"] == pytest.approx(450 / 200)
    assert m["baseline_throughput_tok_s"] == 200.0 and rec.baseline.out_dir == "/b"
    # cost model from the same numbers: T_dec 5 ms, break-even = 5 / 5 = 1, predicted 2.5x
    assert m["break_even_accept_len"] == pytest.approx(1.0) and m["predicted_speedup"] == pytest.approx(2.5)
    checks = {c.name: c for c in rec.checks}
    assert set(checks) == {
        "throughput_in_cycles_vs_accept_over_cycle",
        "time_outside_cycles",
        "profile_vs_counters",
        "phases_within_cycle",
        "client_vs_engine_time",
        "acceptance_not_collapsed",
    }
    # cycle ends stamped 5 ms apart, 5 ms cycles: inside the decode the two clocks agree
    assert checks["throughput_in_cycles_vs_accept_over_cycle"].value == pytest.approx(0.0, abs=1e-6)
    # 50 ms of 450 ms outside the cycles, all in run 0's tail (a fixed cost after the last cycle)
    assert checks["time_outside_cycles"].value == pytest.approx(100 * 50 / 450, abs=0.01)
    assert m["non_cycle_pct"] == pytest.approx(100 * 50 / 450) and m["non_cycle_tail_ms"] == pytest.approx(25.0)
    assert rec.failed_checks == []
    assert any("CV" in w for w in rec.warnings)  # 400 vs 500 tok/s


def test_failed_job_without_runs_has_no_numbers_and_no_checks(tmp_path):
    cfg, rec = new(tmp_path)
    finish(
        rec, cfg, "FAILED", "ServerError: boom", Measured(tmp_path, tmp_path / "server.log", []), None, engine_of(cfg)
    )
    assert (rec.status, rec.error, rec.metrics, rec.checks) == ("FAILED", "ServerError: boom", {}, [])
    assert rec.profile == Profile(missing="no profile lines from rank 0 in the timed runs (plugin not loaded?)")
    assert not [w for w in rec.warnings if "profile" in w]  # no runs: nothing to warn about


def test_the_record_is_written_once_and_reads_back_equal(tmp_path):
    cfg, rec = new(tmp_path)
    rec.runs = [run(0, 100, 0.25, 40, 1000.0)]
    finish(rec, cfg, "FINISHED", None, Measured(tmp_path, tmp_path / "server.log", []), None, engine_of(cfg))
    results.write(tmp_path, rec)
    back = results.read(tmp_path)
    assert back.to_dict() == json.loads(json.dumps(rec.to_dict()))
    assert back.runs[0].throughput_tok_s == 400.0 and back.checks == rec.checks
    with pytest.raises(results.WrittenTwice, match=rec.record_id):
        results.write(tmp_path, rec)
    other = results.JobRecord.from_dict({**rec.to_dict(), "record_id": "another"})
    results.write(tmp_path, other)  # a retried baseline replaces a failed one in its dir
    assert results.read(tmp_path).record_id == "another"


SCHEMA1 = {
    "schema_version": 1,
    "status": "FINISHED",
    "error": None,
    "role": "spec",
    "name": "spec.steps=2",
    "experiment": "adhoc",
    "overrides": ["spec.steps=2"],
    "config": {"nccl": {"name": "tuned"}, "spec": {"steps": 2}},
    "config_hash": "abc",
    "engine": {"name": "embedded", "version": "0.1"},
    "speculative": True,
    "server_env_extra": {},
    "launches": [{"launch": 0, "port": 1, "pid": 2, "server_start_s": 1.5}],
    "runs": [
        {
            "launch": 0,
            "run": 0,
            "start_wall": 1.0,
            "end_wall": 2.0,
            "wall_s": 1.0,
            "prompt_tokens": 3,
            "completion_tokens": 500,
            "e2e_latency_s": 0.99,
            "spec_verify_ct": 200,
            "spec_num_correct_drafts": 300,
            "spec_num_proposed_drafts": 400,
            "throughput_tok_s": 500.0,
        }
    ],
    "warnings": [],
    "started_at": 1.0,
    "ended_at": 3.0,
    "out_dir": "/x",
    "provenance": {"git": {"commit": "c"}},
    "metrics": {"throughput_tok_s": 500.0},
    "server_env": {"NCCL_PROTO": "LL"},
    "variance_components": None,
    "checks": [{"name": "phases_within_cycle", "ok": False, "value": 1.2, "expected": "<= 1.01", "message": "m"}],
    "drift": None,
    "mlflow_run_id": "r1",
    "decode_log": {"lines": 3},
    "some_future_key": {"kept": True},
}


def test_schema1_records_read_and_keep_unknown_keys():
    rec = JobRecord.from_dict(json.loads(json.dumps(SCHEMA1)))
    assert rec.schema_version == 1 and rec.runs[0].throughput_tok_s == 500.0
    assert rec.failed_checks == ["phases_within_cycle"] and rec.choice("nccl") == "tuned" and rec.steps == 2
    assert rec.to_dict()["some_future_key"] == {"kept": True}
    # no record id in schema 1: a stable one, so `tracking sync` finds the record again
    assert rec.record_id == JobRecord.from_dict(json.loads(json.dumps(SCHEMA1))).record_id


def test_collect_finds_records_oldest_first_and_skips_broken_files(tmp_path):
    for i, started in enumerate((30.0, 10.0, 20.0)):
        d = tmp_path / f"job{i}"
        d.mkdir()
        (d / "results.json").write_text(
            json.dumps({**SCHEMA1, "started_at": started, "record_id": f"r{i}", "out_dir": str(d)})
        )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{not json")
    # a copy of job1's record in an artifact store under the same dir counts once, as job1
    (tmp_path / "art" / "x").mkdir(parents=True)
    (tmp_path / "art" / "x" / "results.json").write_text(
        json.dumps({**SCHEMA1, "started_at": 10.0, "record_id": "r1", "out_dir": str(tmp_path / "job1")})
    )
    recs = results.collect(tmp_path)
    assert [r.record_id for r in recs] == ["r1", "r2", "r0"]
    assert recs[0].out_dir == str(tmp_path / "job1")


def test_in_windows_keeps_cycles_ending_inside_each_window():
    cycles = [{"t": t, "cycle_ms": 1.0} for t in (0.5, 1.0, 1.5, 2.0, 2.5, 3.5, 4.0)]
    got = profile.in_windows(cycles, [(1.0, 2.0), (3.0, 4.0), (10.0, 11.0)])
    assert [[c["t"] for c in w] for w in got] == [[1.0, 1.5, 2.0], [3.5, 4.0], []]


def ref(tput: float, env: dict | None = None, started: float = 0.0, ci=None) -> drift.Reference:
    return drift.Reference(f"r{tput}", tput, started, ci, env or {"NCCL_PROTO": "LL"})


def test_drift_interval_and_environment_findings():
    assert drift.check(300.0, {}, []) is None  # nothing to compare with
    earlier = [ref(300.0, started=1), ref(310.0, started=2), ref(290.0, started=3)]
    ok = drift.check(305.0, {"NCCL_PROTO": "LL"}, earlier)
    assert ok.message is None and not ok.outside_interval and ok.earlier_runs == 3
    # mean 300, sd 10, n 3: 300 +- t(0.975, 2) x 10 x sqrt(4/3) = 300 +- 49.7
    assert ok.interval_tok_s == pytest.approx([300 - 49.68, 300 + 49.68], abs=0.01)
    low = drift.check(200.0, {"NCCL_PROTO": "LL"}, earlier)
    assert low.outside_interval and low.message.startswith("DRIFT: baseline 200.0 tok/s is outside")
    assert "no provenance difference found" in low.message
    lost = drift.check(305.0, {}, earlier)
    assert lost.env_differences == ["NCCL_PROTO was LL in the earlier runs, unset now"]
    assert "looks normal, but the provenance changed" in lost.message
    # the newest earlier run's environment is the reference
    changed = drift.check(305.0, {"NCCL_PROTO": "LL"}, [ref(300.0, {"NCCL_PROTO": "Simple"}, 9), *earlier])
    assert changed.env_differences == ["NCCL_PROTO was Simple in the earlier runs, LL now"]
    # one earlier run is no evidence for an interval (tests/unit/test_drift.py has 1, 2 and 3)
    one = drift.check(250.0, {"NCCL_PROTO": "LL"}, [ref(300.0, ci=(290.0, 310.0))])
    assert one.interval_tok_s is None and not one.outside_interval and one.note.startswith("too few")


def test_add_drift_only_for_finished_baselines(tmp_path):
    _, spec = new(tmp_path)
    spec.status, spec.metrics = "FINISHED", {"throughput_tok_s": 1.0}
    add_drift(spec, [ref(300.0)])
    assert spec.drift is None
    _, base = new(tmp_path, "drafter=none", role="baseline")
    base.status, base.metrics, base.server_env = "FINISHED", {"throughput_tok_s": 100.0}, {"NCCL_PROTO": "LL"}
    add_drift(base, [ref(300.0, started=1), ref(310.0, started=2), ref(290.0, started=3)])
    assert base.drift.outside_interval and base.warnings == [base.drift.message]
