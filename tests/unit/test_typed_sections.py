"""Record sections held as types, not dicts (issue 45): each reads from the JSON it always had and writes it
back byte for byte (results.json and metrics.json on disk do not change)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from spec_decode import bench
from spec_decode.analysis import blocks, sections
from spec_decode.analysis import load as analysis_load
from spec_decode.core.config import BenchmarkConfig
from spec_decode.core.prompts import Prompt
from spec_decode.parsers import profile
from spec_decode.record import results
from spec_decode.record.load import BatchInvariance, LoadSection, Running, Spread
from spec_decode.record.measured import HostWindow, Launch, LoadRequest, LoadRun, ProcCpu, ProfilePass, Request
from spec_decode.record.payloads import nccl_probe_from
from spec_decode.record.provenance import Provenance
from spec_decode.record.results import BaselineRef, EngineInfo, JobRecord
from spec_decode.record.runs import RunRecord
from spec_decode.record.sections import (
    Acceptance,
    Category,
    DecodeLog,
    Distribution,
    Latency,
    Lossless,
    Profile,
    Speedup,
    Summary,
    VarianceComponents,
    categories_from,
    lossless_from,
)
from spec_decode.record.typed import ABSENT
from spec_decode.runner import load, machine, request_pass
from spec_decode.runner import provenance as runner_provenance
from spec_decode.views.metrics_json import records_from_metrics, to_metrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = {
    "code": {"n": 4, "accept_len": 3.1, "throughput_tok_s": 410.0},
    "chat": {"n": 2, "accept_len": None, "throughput_tok_s": 350},  # a baseline: no counters; an int median
}


def test_categories_are_typed_and_results_json_is_rewritten_byte_for_byte(tmp_path):
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.categories = categories_from(CATEGORIES)
    assert rec.categories["code"] == Category(4, 3.1, 410.0) and rec.categories["chat"].accept_len is None
    path = results.write(tmp_path, rec)
    first = path.read_text()
    assert json.loads(first)["categories"] == CATEGORIES  # the JSON it always had, in its order
    back = results.read(tmp_path)
    assert back.categories == rec.categories
    back.record_id = "another"  # a second write of the same record is refused; the bytes are what count
    second = results.write(tmp_path / "again", back).read_text()
    assert second.replace('"another"', f'"{rec.record_id}"') == first


def test_metrics_json_keeps_the_categories_and_rebuilds_them_typed():
    metrics = json.loads((ROOT / "experiments" / "embedded_depth" / "metrics.json").read_text())
    recs = records_from_metrics(metrics)
    typed = [r for r in recs if r.categories]
    assert typed and all(isinstance(c, Category) for r in typed for c in r.categories.values())
    assert all("categories" not in r.extra for r in recs)
    again = to_metrics(recs)
    for key, e in metrics["jobs"].items():
        if "categories" in e:
            assert again["jobs"][key]["categories"] == e["categories"]


LOSSLESS = {  # the load guard's verdict: the one with ``what``
    "checked": True,
    "requests": 8,
    "matched": 7,
    "match_rate": 0.875,
    "first_divergence": {"load:3": 17},
    "verdict": "fail",
    "reason": "1 of 8 outputs differ from the baseline's",
    "what": "every request under load vs the baseline's output of its prompt at bs 1",
}


@pytest.mark.parametrize("what", [True, False])
def test_lossless_is_typed_and_results_json_is_rewritten_byte_for_byte(tmp_path, what):
    data = dict(LOSSLESS) if what else {k: v for k, v in LOSSLESS.items() if k != "what"}
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.lossless = lossless_from(data)
    assert isinstance(rec.lossless, Lossless) and rec.lossless.first_divergence == {"load:3": 17}
    path = results.write(tmp_path, rec)
    first = path.read_text()
    assert list(json.loads(first)["lossless"].items()) == list(data.items())  # its keys, in their order
    back = results.read(tmp_path)
    assert back.lossless == rec.lossless
    back.record_id = "another"
    assert results.write(tmp_path / "again", back).read_text().replace('"another"', f'"{rec.record_id}"') == first
    # a record without a verdict (a refused job) keeps writing {} as before
    empty = JobRecord("spec", "x", "x", {}, "h", EngineInfo("embedded"), True)
    assert empty.lossless is None and json.loads(results.write(tmp_path / "empty", empty).read_text())["lossless"] == {}


def test_metrics_json_keeps_the_lossless_verdicts_and_rebuilds_them_typed():
    metrics = json.loads((ROOT / "experiments" / "embedded_concurrency" / "metrics.json").read_text())
    recs = records_from_metrics(metrics)
    typed = [r for r in recs if r.lossless is not None]
    assert typed and all(isinstance(r.lossless, Lossless) for r in typed)
    assert all("lossless" not in r.extra for r in recs)
    again = to_metrics(recs)
    for key, e in metrics["jobs"].items():
        if "lossless" in e:
            assert again["jobs"][key]["lossless"] == e["lossless"]


# ---- the derived sections (record.sections): tok/s, speedup, acceptance, latency ----------------------
SUMMARY_KEYS = ["n", "mean", "median", "std", "cv", "ci95_lo", "ci95_hi", "robust_cv"]
RATIO_KEYS = ["ratio", "ci95_lo", "ci95_hi", "df", "significant"]
COUNTER_KEYS = ["accept_len", "accept_rate_draft", "accept_rate_incl_bonus", "accept_len_source", "per_run_accept_len"]
BY_REQUEST_KEYS = ["steps", "histogram", "per_position", "source", "histogram_scope", "accept_len_weighted"]
BY_REQUEST_KEYS += ["accept_len_unweighted", "requests_from", "per_request"]


def run(i: int, tok_s: float, stream: bool = False, hist=(10, 10, 20)) -> RunRecord:
    return RunRecord(
        i % 2, i, float(i), i + 1.0, 100 / tok_s, 8, 100, 0.9, 40, 50, 80,
        spec_correct_drafts_histogram=list(hist),
        ttft_s=0.01 * (i + 1) if stream else None,
        token_gaps_s=[0.002] * 99 if stream else None,
        stream=stream,
    )  # fmt: skip


def derived(tmp_path: Path) -> JobRecord:
    """A spec job's record with its derived sections from the analysis functions the job's finish calls."""
    rec = JobRecord("spec", "spec.steps=2", "x", {"spec": {"steps": 2}}, "h", EngineInfo("embedded"), True)
    rec.runs = [run(i, t, stream=True) for i, t in enumerate((400.0, 410.0, 395.0, 405.0))]
    rec.baseline_runs = [run(i, t) for i, t in enumerate((200.0, 210.0, 190.0, 205.0))]
    for sec in (sections.throughput(rec.runs, 2), sections.acceptance_counters(rec.runs, 3)):
        vars(rec).update(sec.fields)
    vars(rec).update(sections.request_acceptance(2, rec.runs, None, None, rec.acceptance).fields)
    sp, base = sections.speedup(rec.runs, rec.baseline_runs, ["interleaved"], None, None)
    vars(rec).update(sp.fields, **sections.latency_percentiles(rec.runs).fields)
    rec.baseline = BaselineRef(None, None, base)
    return rec


def rewritten(tmp_path: Path, rec: JobRecord) -> tuple[str, JobRecord, str]:
    """(the first write, the record read back, its write in another dir with the same id)."""
    first = results.write(tmp_path / "one", rec).read_text()
    back = results.read(tmp_path / "one")
    back.record_id = "another"
    second = results.write(tmp_path / "two", back).read_text().replace('"another"', f'"{rec.record_id}"')
    return first, back, second


def test_derived_sections_are_typed_and_results_json_keeps_their_keys_and_bytes(tmp_path):
    rec = derived(tmp_path)
    assert isinstance(rec.throughput_tok_s, Summary) and isinstance(rec.speedup_vs_baseline, Speedup)
    assert isinstance(rec.acceptance, Acceptance) and isinstance(rec.latency, Latency)
    assert isinstance(rec.baseline.throughput_tok_s, Summary) and isinstance(rec.latency.ttft_ms, Distribution)
    assert isinstance(rec.variance_components, VarianceComponents) and rec.variance_components.launches == 2
    first, back, second = rewritten(tmp_path, rec)
    assert second == first
    for name, typ in (("throughput_tok_s", Summary), ("speedup_vs_baseline", Speedup), ("acceptance", Acceptance)):
        assert isinstance(getattr(back, name), typ) and getattr(back, name) == getattr(rec, name), name
    assert back.latency == rec.latency and back.baseline == rec.baseline
    assert back.variance_components == rec.variance_components
    d = json.loads(first)
    # the keys (and their order) the record had when these sections were dicts
    assert list(d["throughput_tok_s"]) == SUMMARY_KEYS == list(d["baseline"]["throughput_tok_s"])
    assert list(d["speedup_vs_baseline"]) == [*RATIO_KEYS, "method", "pairs", "pairing", "per_pair"]
    assert d["speedup_vs_baseline"]["method"] == "paired" and d["speedup_vs_baseline"]["pairs"] == 4
    assert list(d["acceptance"]) == COUNTER_KEYS + BY_REQUEST_KEYS
    assert d["acceptance"]["histogram"] == [40, 40, 80] and d["acceptance"]["accept_rate_draft"] == 50 / 80
    assert list(d["variance_components"]) == ["launches", "std_within", "std_between", "between_share"]
    assert list(d["latency"]) == ["ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"]
    assert all(list(x) == ["p50", "p90", "p99", "mean", "n"] for x in d["latency"].values())
    assert d["latency"]["itl_ms"]["n"] == 4 * 99 and d["latency"]["ttft_ms"]["p50"] == pytest.approx(25.0)


def test_the_other_shapes_of_the_derived_sections_keep_their_keys(tmp_path):
    """welch; a cell folded over blocks; counters without a histogram (None kept); the profile and the
    counters both (their agreement); no streamed run (latency written {} and read back None)."""
    rec = derived(tmp_path)
    rec.speedup_vs_baseline = sections.speedup(rec.runs, [], [], rec.baseline_runs, rec.baseline.throughput_tok_s)[
        0
    ].fields["speedup_vs_baseline"]
    rec.acceptance = sections.acceptance_counters([run(0, 400.0)], 3).fields["acceptance"]
    rec.acceptance.accept_rate_draft = None  # a counter SGLang did not report: written null, not dropped
    rec.latency = sections.latency_percentiles([run(0, 400.0)]).fields["latency"]
    rec.variance_components = sections.throughput([run(0, 400.0), run(1, 410.0)], 2).fields["variance_components"]
    first, back, second = rewritten(tmp_path, rec)
    d = json.loads(first)
    assert second == first and list(d["speedup_vs_baseline"]) == [*RATIO_KEYS, "method"]
    assert list(d["acceptance"]) == COUNTER_KEYS and d["acceptance"]["accept_rate_draft"] is None
    assert rec.latency is None and d["latency"] == {} and back.latency is None
    # one run per launch: no split, its four keys written null
    assert d["variance_components"] == {"launches": 2, "std_within": None, "std_between": None, "between_share": None}
    assert back.variance_components == rec.variance_components
    both = sections.request_acceptance(2, rec.runs, [[{"accepted": 3}] * 10] * 4, None, None).fields["acceptance"]
    assert both.profile_matches_meta_info is False  # 10 cycles of 2 drafts vs the runs' histograms
    assert list(both.as_dict()) == [*BY_REQUEST_KEYS, "profile_matches_meta_info"]
    cell = blocks.fold([block_of(rec, b, s) for b, s in enumerate((1.9, 2.1, 2.0))])
    assert list(cell.throughput_tok_s.as_dict()) == [*SUMMARY_KEYS, "unit"]
    assert list(cell.speedup_vs_baseline.as_dict()) == [*RATIO_KEYS, "method", "per_block", "rerun95"]


def block_of(rec: JobRecord, block: int, speedup: float) -> JobRecord:
    out = JobRecord.from_dict(rec.to_dict())
    out.name, out.status, out.record_id = f"benchmark.block={block},spec.steps=2", "FINISHED", f"b{block}"
    out.config = {"spec": {"steps": 2}, "benchmark": {"block": block}}
    out.metrics = {"throughput_tok_s": 400.0 + block, "speedup_vs_baseline": speedup}
    return out


def profile_files(tmp_path: Path) -> Path:
    """Two ranks' profile lines: 20 cycles each inside the first run's window, rank 1 10% slower."""
    base = tmp_path / "profile.jsonl"
    for rank in (0, 1):
        cycles = [
            {"t": 0.01 + k * 0.04, "rank": rank, "draft_ms": 1.0, "verify_ms": 8.0, "extend_ms": 0.5, "accepted": 2}
            for k in range(20)
        ]
        lines = [json.dumps({**c, "cycle_ms": 10.0 + rank}) for c in cycles]
        Path(profile.rank_path(base, rank)).write_text("\n".join(lines) + "\n")
    return base


def test_the_phase_profile_is_typed_and_keeps_the_parser_s_keys_then_the_job_s(tmp_path):
    path, runs = profile_files(tmp_path), [run(0, 500.0)]
    na = "SGLang's overlap scheduler: enqueue stamps"
    sec, _ = sections.phase_profile(path, runs, False, True, True, na)
    rec = derived(tmp_path)
    rec.profile = sec.fields["profile"]
    assert isinstance(rec.profile, Profile) and rec.profile.cycles == 20 and rec.profile.complete is False
    first, back, second = rewritten(tmp_path, rec)
    assert second == first and isinstance(back.profile, Profile) and back.profile == rec.profile
    parsed, _ = profile.summarize_run_windows(path, [(0.0, 1.0)], requests=[(None, 40)])
    assert "rank_agreement" in parsed  # two ranks
    job = ["per_run", "non_cycle_ms_per_request", "spec_verify_ct", "measured_in", "measured_in_tok_s", "complete"]
    assert list(json.loads(first)["profile"]) == [*parsed, *job, "host_stamps_na"]
    assert json.loads(first)["profile"]["host_stamps_na"] == na
    # without a profile: why, and nothing else
    rec.profile = sections.phase_profile(tmp_path / "none.jsonl", runs, False, False, True)[0].fields["profile"]
    first, back, second = rewritten(tmp_path / "missing", rec)
    assert json.loads(first)["profile"] == {"missing": "profiling off (benchmark.profile=false)"} and second == first
    assert back.profile == Profile(missing="profiling off (benchmark.profile=false)")
    # a profile whose requests have no timing writes its per-request figure null, as before it was typed
    assert Profile(cycles=3).as_dict() == {"cycles": 3, "non_cycle_ms_per_request": None}


def test_a_section_of_another_type_is_refused_at_the_write(tmp_path):
    """A writer that puts the old dict back where the type belongs fails the write (not a silent dict)."""
    for name in ("throughput_tok_s", "speedup_vs_baseline", "acceptance", "latency", "profile", "variance_components"):
        rec = derived(tmp_path)
        rec.profile = Profile(missing="profiling off")
        setattr(rec, name, getattr(rec, name).as_dict())
        with pytest.raises(TypeError, match=name):
            results.write(tmp_path / name, rec)


@pytest.mark.parametrize(
    "name, value",
    [
        ("throughput_tok_s", [400.0, 3.0]),
        ("speedup_vs_baseline", "2.0x"),
        ("acceptance", [1, 2]),
        ("profile", "profiling off"),
        ("variance_components", {"launches": 2}),  # without its figures
        ("latency", {"ttft_ms": {"p50": 1.0}}),  # a kind without its other figures
        ("latency", {"ttfb_ms": {"p50": 1, "p90": 1, "p99": 1, "mean": 1, "n": 1}}),  # no such kind
    ],
)
def test_a_results_json_with_a_misshapen_section_does_not_read(tmp_path, name, value):
    d = derived(tmp_path).to_dict()
    with pytest.raises(TypeError):
        JobRecord.from_dict({**d, name: value})


def test_keys_a_section_does_not_know_are_kept():
    d = derived(Path()).to_dict()
    d["speedup_vs_baseline"]["vs_baseline_job"] = {"ratio": 2.0}  # another schema's key
    d["throughput_tok_s"]["p10"] = 390.0
    back = JobRecord.from_dict(json.loads(json.dumps(d)))
    assert back.speedup_vs_baseline.extra == {"vs_baseline_job": {"ratio": 2.0}}
    assert back.to_dict()["speedup_vs_baseline"] == d["speedup_vs_baseline"]
    assert back.to_dict()["throughput_tok_s"] == d["throughput_tok_s"]


EXPERIMENTS = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/metrics.json"))
KEPT = re.compile(r"^(throughput_tok_s(_\w+)?|speedup_method|acceptance|latency)$")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_committed_metrics_json_rebuilds_the_derived_sections_typed(experiment):
    metrics = json.loads((ROOT / "experiments" / experiment / "metrics.json").read_text())
    if "jobs" not in metrics:  # a drafter experiment: per drafter, not per job record
        return
    recs = records_from_metrics(metrics)
    done = [r for r in recs if r.throughput_tok_s is not None]
    assert done and all(isinstance(r.throughput_tok_s, Summary) for r in done)
    assert all(isinstance(r.speedup_vs_baseline, Speedup | None) for r in recs)
    assert all(isinstance(r.acceptance, Acceptance | None) and isinstance(r.latency, Latency | None) for r in recs)
    assert all(not r.extra for r in recs)
    again = to_metrics(recs)["jobs"]
    for key, e in metrics["jobs"].items():
        mine = {k: v for k, v in again[key].items() if KEPT.match(k)}
        assert mine == {k: v for k, v in e.items() if KEPT.match(k)}, key


def test_the_drafter_bench_reads_a_job_s_tok_s_from_the_typed_record(tmp_path):
    """``bench drafters``' per-job figures from a collected record (a JobRecord, not the JSON dict)."""
    rec = derived(tmp_path)
    rec.status, rec.metrics = "FINISHED", {"throughput_tok_s": rec.throughput_tok_s.mean, "accept_len": 2.5}
    results.write(tmp_path / "sweep" / "0", rec)
    (got,) = results.collect(tmp_path / "sweep")
    t = rec.throughput_tok_s
    assert bench.job_metrics(got) == {
        "status": "FINISHED",
        "throughput_tok_s": round(t.mean, 2),
        **{f"throughput_tok_s_{k}": round(getattr(t, k), 3) for k in ("ci95_lo", "ci95_hi", "std", "n")},
        "accept_len": 2.5,
    }


# ---- the measured sections (record.measured, record.provenance, record.sections.DecodeLog) -------------
LAUNCH_KEYS = ["launch", "port", "pid", "server_start_s", "server_nice", "baseline_port", "baseline_pid"]
LAUNCH_KEYS += ["baseline_server_start_s", "pairing", "baseline_server_nice", "warmup_s", "load_reference"]
LAUNCH_KEYS += ["load_runs", "pairs", "host"]
LOAD_RUN_KEYS = ["arm", "run", "log_window", "requests", "completion_tokens", "wall_s", "aggregate_tok_s"]
LOAD_RUN_KEYS += ["request_tok_s", "accept_len_per_request", "latency", "request_entries", "running"]
LOAD_REQUEST_KEYS = ["i", "prompt_index", "sent_s", "scheduled_s", "wall_s", "completion_tokens", "prompt_tokens"]
LOAD_REQUEST_KEYS += ["spec_verify_ct", "tok_s", "accept_len", "ttft_s", "output_sha256", "equals_reference"]
REQUEST_KEYS = ["prompt_index", "category", "completion_tokens", "wall_s", "throughput_tok_s", "accept_len"]
REQUEST_KEYS += ["verify_ct", "correct_drafts", "histogram", "ttft_ms", "output_sha256"]
PROVENANCE_KEYS = ["root", "git", "packages", "machine", "gpu", "host", "data", "drafter_lineage", "nccl"]
DECODE_LOG_KEYS = ["lines", "used_lines", "gen_throughput_tok_s_median", "accept_len_median"]
DECODE_LOG_KEYS += ["accept_rate_median", "graph", "notes"]
DECODE_LINE = "[2025-01-01 00:00:0{}] Decode batch. #running-req: 2, #queue-req: 0, accept len: 2.5, cuda graph: True"


def load_run(arm: str, run_: int, diverged: bool = False) -> LoadRun:
    """A timed run under load as ``runner.load.LoadRunner`` records it (its figures: ``analysis.load``)."""
    reqs = [run(i, 300.0 + i) for i in range(2)]
    entries = [
        LoadRequest(i, i, 0.01 * i, None, r.wall_s, r.completion_tokens, 8, r.spec_verify_ct, 300.0, 2.5, None,
                    r.output_sha256, not diverged or i == 0, [1, 2] if diverged and i else ABSENT)
        for i, r in enumerate(reqs)
    ]  # fmt: skip
    return LoadRun(arm, run_, [0, 10**6], **analysis_load.run_figures(reqs, 1.0), request_entries=entries)


def measured(tmp_path: Path) -> JobRecord:
    """A spec job's record with every measured section filled by the functions the job calls."""
    rec = derived(tmp_path)
    a, b = {"t": 1.0, "cpu": [0] * 8, "loadavg": []}, {"t": 2.0, "cpu": [5, 0, 0, 3, 1, 0, 0, 1], "loadavg": [1.0]}
    paired = Launch(0, 30001, 41, 12.5, -5, 30002, 42, 12.75, "interleaved", -5, 0.5)
    paired.load_reference = {load.SELF: {"0": [5, 6], "1": [5, 6]}, load.PAIRED: {"0": [5, 6], "1": [5, 6]}}
    paired.load_runs = [load_run(load.SELF, 0, diverged=True), load_run(load.PAIRED, 0)]
    paired.pairs, paired.host = [{"pair": 0, "order": "AB"}], machine.window(a, b)
    srv = subprocess.Popen(["sleep", "30"])  # a one-process "server", read twice (this worker may have children)
    try:
        paired.host.server_procs = machine.tree_window(machine.tree_sample(srv.pid), machine.tree_sample(srv.pid))
    finally:
        srv.kill()
        srv.wait()
    paired.host.server_procs[0].extra["server"] = srv.pid  # kept for the test below (an unknown key: extra)
    paired.host.baseline_procs = [ProcCpu("launcher", 42, 0.25, 25.0, 3), ProcCpu("rank0", 44, 0.9, 90.0)]
    alone = Launch(1, 30003, 43, None, host=machine.window(a, a))  # no pairing, no warmup, no load
    rec.launches = [paired, alone]
    prompts = [Prompt(i, f"p{i}", c) for i, c in enumerate(("code", "qa"))]
    rec.requests = [request_pass.entry(p, run(i, 200.0, stream=i == 0)) for i, p in enumerate(prompts)]
    rec.profile_pass = ProfilePass(2, "ABBA: (on, dormant), (dormant, on), ...", 1, [401.0, 399.0])
    rec.profiled_runs = [run(i, 390.0 + i) for i in range(2)]
    rec.provenance = runner_provenance.collect(ROOT, {"prompts": "data/prompts.txt", "drafter": None})
    rec.provenance.drafter_lineage = {"drafter.training_run_id": "r1"}
    for sec in (
        sections.profiler_cost(rec.profile_pass, rec.profiled_runs, rec.runs),
        sections.nccl_section(nccl_probe_from({"backend": "gloo", "world_size": 2, "sizes": {}}), rec.provenance),
        sections.decode_log_summary([DECODE_LINE.format(k) for k in range(3)]),
    ):
        vars(rec).update(sec.fields)
    log = tmp_path / "server.log"
    log.write_text("\n".join(DECODE_LINE.format(k) for k in range(3)) + "\n")
    vars(rec)[analysis_load._MEMORY] = {load.SELF: [[run(i, 300.0) for i in range(2)]], load.PAIRED: []}
    analysis_load.finish(rec, BenchmarkConfig(concurrency=2), None, log, log, exact=True)  # each run's running
    return rec


def test_the_measured_sections_are_typed_and_keep_their_keys_and_bytes(tmp_path):
    rec = measured(tmp_path)
    assert isinstance(rec.launches[0].host, HostWindow) and isinstance(rec.requests[0], Request)
    assert isinstance(rec.provenance, Provenance) and isinstance(rec.decode_log, DecodeLog)
    first, back, second = rewritten(tmp_path, rec)
    assert second == first
    for name in ("launches", "requests", "profile_pass", "provenance", "decode_log"):
        assert getattr(back, name) == getattr(rec, name), name
    d = json.loads(first)
    assert list(d["launches"][0]) == LAUNCH_KEYS and list(d["launches"][1]) == ["launch", "port", "pid"] + [
        "server_start_s", "host"
    ]  # fmt: skip
    assert d["launches"][1]["server_start_s"] is None and d["launches"][1]["host"] == {
        "s": 0.0, "load1_start": None, "load1_end": None
    }  # fmt: skip
    assert list(d["launches"][0]["host"]) == [
        "s", "load1_start", "load1_end", "busy_pct", "steal_pct", "iowait_pct", "server_procs", "baseline_procs"
    ]  # fmt: skip
    procs = back.launches[0].host.server_procs
    assert [type(x) for x in procs] == [ProcCpu] and procs[0].name == "launcher"
    assert (
        procs[0].pid == procs[0].extra["server"]
        and d["launches"][0]["host"]["server_procs"][0]["server"] == procs[0].pid
    )
    assert d["launches"][0]["host"]["baseline_procs"][1] == {
        "name": "rank0",
        "pid": 44,
        "cpu_s": 0.9,
        "core_pct": 90.0,
        "threads": None,
    }
    assert back.launches[1].host.server_procs is ABSENT  # a launch recorded before the account
    runs_ = d["launches"][0]["load_runs"]
    assert list(runs_[0]) == LOAD_RUN_KEYS and runs_[0]["running"]["lines"] == 3
    assert list(runs_[0]["request_entries"][1]) == [*LOAD_REQUEST_KEYS, "output_ids"]  # the one that diverged
    assert list(runs_[0]["request_entries"][0]) == LOAD_REQUEST_KEYS
    assert [list(e) for e in d["requests"]] == [REQUEST_KEYS] * 2 and d["requests"][1]["ttft_ms"] is None
    assert list(d["profile_pass"]) == ["pairs", "order", "launch", "dormant_tok_s", "effect"]
    assert d["profile_pass"]["effect"]["pairs"] == 2
    assert list(d["provenance"]) == PROVENANCE_KEYS and d["provenance"]["nccl"]["backend"] == "gloo"
    assert list(d["decode_log"]) == DECODE_LOG_KEYS and d["decode_log"]["accept_rate_median"] is None


def test_the_measured_sections_keep_absent_apart_from_null(tmp_path):
    """The profiled pass before its effect is added (no key), and with none measured (null); provenance
    keys a record lacks (a schema-1 record: its git only) or collected as None; decode_log's too."""
    rec = measured(tmp_path)
    rec.profile_pass = ProfilePass(0, "ABBA", 0, [])
    assert "effect" not in rec.profile_pass.as_dict()
    vars(rec).update(sections.profiler_cost(rec.profile_pass, [], rec.runs).fields)
    assert rec.profile_pass.effect is None and rec.profile_pass.as_dict()["effect"] is None
    rec.provenance = Provenance(git={"commit": "c"}, gpu=None)
    rec.decode_log = DecodeLog(lines=3)
    first, back, second = rewritten(tmp_path, rec)
    d = json.loads(first)
    assert second == first and back.profile_pass.effect is None and "effect" in d["profile_pass"]
    assert d["provenance"] == {"git": {"commit": "c"}, "gpu": None} and back.provenance.root is ABSENT
    assert d["decode_log"] == {"lines": 3} and back.decode_log == rec.decode_log
    without = JobRecord.from_dict({**d, "profile_pass": {k: v for k, v in d["profile_pass"].items() if k != "effect"}})
    assert without.profile_pass.effect is ABSENT and "effect" not in without.to_dict()["profile_pass"]
    empty = JobRecord("spec", "x", "x", {}, "h", EngineInfo("embedded"), True)  # a refused job's record
    assert [empty.to_dict()[k] for k in ("launches", "requests", "profile_pass", "provenance", "decode_log")] == [
        [], [], None, {}, None
    ]  # fmt: skip


PLANTS = {
    "launches": lambda r: setattr(r, "launches", [r.launches[0].as_dict()]),
    "launches[].host": lambda r: setattr(r.launches[0], "host", r.launches[0].host.as_dict()),
    "launches[].host.server_procs[]": lambda r: r.launches[0].host.server_procs.append({"name": "rank0"}),
    "launches[].load_runs[]": lambda r: r.launches[0].load_runs.append(r.launches[0].load_runs[0].as_dict()),
    "request_entries[]": lambda r: r.launches[0].load_runs[0].request_entries.append({"i": 9}),
    "requests": lambda r: setattr(r, "requests", [r.requests[0].as_dict()]),
    "profile_pass": lambda r: setattr(r, "profile_pass", r.profile_pass.as_dict()),
    "provenance": lambda r: setattr(r, "provenance", r.provenance.as_dict()),
    "decode_log": lambda r: setattr(r, "decode_log", r.decode_log.as_dict()),
    "load": lambda r: setattr(r, "load", r.load.as_dict()),
    "load.running": lambda r: setattr(r.load, "running", r.load.running.as_dict()),
    "load.batch_invariance": lambda r: setattr(r.load, "batch_invariance", r.load.batch_invariance.as_dict()),
    "load.paired_baseline": lambda r: setattr(r.load, "paired_baseline", r.load.paired_baseline.as_dict()),
    "launches[].load_runs[].running": lambda r: setattr(r.launches[0].load_runs[0], "running", {"lines": 3}),
}


@pytest.mark.parametrize("where", PLANTS)
def test_a_measured_section_of_another_type_is_refused_at_the_write(tmp_path, where):
    rec = measured(tmp_path)
    PLANTS[where](rec)
    with pytest.raises(TypeError, match=re.escape(where.split("[]")[0])):
        results.write(tmp_path / "planted", rec)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("launches", lambda d: {"0": d}),  # not a list
        ("launches", lambda d: [{k: v for k, v in d[0].items() if k != "pid"}]),  # without its pid
        ("launches", lambda d: [{**d[0], "host": [1.0, 2.0]}]),
        ("launches", lambda d: [{**d[0], "load_runs": [{"arm": "self"}]}]),  # a run without its figures
        ("requests", lambda d: [{k: v for k, v in d[0].items() if k != "verify_ct"}]),
        ("requests", lambda d: "12 requests"),
        ("profile_pass", lambda d: [d]),
        ("profile_pass", lambda d: {"pairs": 2}),  # without its order, launch and dormant runs
        ("provenance", lambda d: ["git"]),
        ("decode_log", lambda d: "3 lines"),
        ("load", lambda d: [d]),
        ("load", lambda d: {k: v for k, v in d.items() if k != "mode"}),
        ("load", lambda d: {**d, "running": {"lines": 3}}),  # a running batch without its figures
        ("load", lambda d: {**d, "paired_baseline": {"concurrency": 2}}),
        ("load", lambda d: {**d, "latency": {"ttfb_ms": {}}}),
    ],
)
def test_a_results_json_with_a_misshapen_measured_section_does_not_read(tmp_path, name, bad):
    d = json.loads(json.dumps(measured(tmp_path).to_dict()))
    with pytest.raises(TypeError):
        JobRecord.from_dict({**d, name: bad(d[name])})
    assert JobRecord.from_dict(d).to_dict() == d


LOAD_KEYS = ["concurrency", "request_rate", "mode", "requests", "runs", "request_tok_s", "accept_len_per_request"]
LOAD_KEYS += ["latency", "running", "batch_invariance"]


def test_the_load_section_is_typed_and_keeps_its_keys_and_bytes(tmp_path):
    """``load`` (analysis.load.finish): the record's own server's, with the paired baseline server's inside;
    written last, as when it was kept in ``extra``; a record without load has no ``load`` key."""
    rec = measured(tmp_path)
    s = rec.load
    assert isinstance(s, LoadSection) and isinstance(s.running, Running) and isinstance(s.request_tok_s, Spread)
    assert isinstance(s.batch_invariance, BatchInvariance) and isinstance(s.paired_baseline, LoadSection)
    assert isinstance(rec.launches[0].load_runs[0].running, Running)
    first, back, second = rewritten(tmp_path, rec)
    assert second == first and back.load == rec.load and back.launches == rec.launches
    d = json.loads(first)
    assert list(d)[-1] == "load" and "load" not in back.extra
    assert list(d["load"]) == [*LOAD_KEYS, "profile_note", "paired_baseline"]
    assert list(d["load"]["paired_baseline"]) == LOAD_KEYS and d["load"]["paired_baseline"]["request_tok_s"] is None
    assert d["load"]["latency"] == {} and d["load"]["runs"][0]["running"] == d["launches"][0]["load_runs"][0]["running"]
    assert list(d["load"]["running"])[:3] == ["lines", "running_median", "running_max"]
    assert analysis_load.metrics_of(s)["running_req_median"] == s.running.running_median == 2
    assert "load" not in JobRecord("spec", "x", "x", {}, "h", EngineInfo("embedded"), True).to_dict()
