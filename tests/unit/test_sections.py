"""The record's sections one at a time (analysis.sections, record.provenance): each a pure function fed a
known input, its verdict asserted -- no record, no finish."""

import json

import pytest

from spec_decode.analysis import sections
from spec_decode.parsers import profile
from spec_decode.record import provenance
from spec_decode.record.runs import RunRecord
from spec_decode.record.sections import Summary

pytestmark = pytest.mark.unit


def run(i: int, tok_s: float, launch: int = 0, t0: float = 0.0, verify_ct: int | None = None) -> RunRecord:
    return RunRecord(
        launch=launch,
        run=i,
        start_wall=t0,
        end_wall=t0 + 1.0,
        wall_s=100 / tok_s,
        prompt_tokens=10,
        completion_tokens=100,
        spec_verify_ct=verify_ct,
    )


def test_throughput_warns_above_the_cv_limit_and_splits_launches_only_when_there_are_several():
    steady = sections.throughput([run(i, 500.0 + i) for i in range(4)], launches=1)
    assert steady.warnings == [] and "variance_components" not in steady.fields
    assert steady.metrics["throughput_tok_s"] == pytest.approx(501.5)
    noisy = sections.throughput([run(0, 400.0, 0), run(1, 600.0, 0), run(2, 450.0, 1), run(3, 650.0, 1)], launches=2)
    assert len(noisy.warnings) == 1 and noisy.warnings[0].startswith("run-to-run CV")
    assert noisy.fields["variance_components"].launches == 2
    assert sections.throughput([], launches=1) == sections.Section()


def test_speedup_pairs_runs_in_order_and_falls_back_to_welch_only_without_pairs():
    spec = [run(i, 600.0) for i in range(3)]
    paired = [run(0, 300.0), run(1, 200.0), run(2, 600.0)]  # per pair: 2x, 3x, 1x
    sec, base = sections.speedup(spec, paired, ["interleaved"], [run(0, 100.0)], Summary(mean=100.0))
    sp = sec.fields["speedup_vs_baseline"]
    assert sp.method == "paired" and sp.pairs == 3 and sp.per_pair == pytest.approx([2.0, 3.0, 1.0])
    assert base.mean == pytest.approx(1100 / 3)  # the paired arm's runs, not the job's
    assert "vs_baseline_job" not in sp.as_dict()  # one baseline per job: the paired one
    # a paired arm one run short: pairs are the first n of each, never shifted
    sec, _ = sections.speedup(spec, paired[:2], ["interleaved"], None, None)
    assert sec.fields["speedup_vs_baseline"].per_pair == pytest.approx([2.0, 3.0])
    sec, base = sections.speedup(spec, [], [], [run(0, 300.0), run(1, 300.0)], Summary(mean=300.0))
    assert sec.fields["speedup_vs_baseline"].method == "welch" and sec.metrics["speedup_vs_baseline"] == 2.0
    assert sections.speedup(spec, [], [], None, None) == (sections.Section(), None)


def write_ranks(tmp_path, cycle_ms_by_rank: dict[int, float], n: int = 20):
    base = tmp_path / "profile.jsonl"
    for rank, cycle_ms in cycle_ms_by_rank.items():
        with open(profile.rank_path(base, rank), "w") as f:
            for k in range(n):
                f.write(
                    json.dumps(
                        {
                            "t": 0.01 + k * 0.04,
                            "rank": rank,
                            "draft_ms": 1.0,
                            "verify_ms": cycle_ms - 2,
                            "extend_ms": 0.5,
                            "cycle_ms": cycle_ms,
                            "accepted": 2,
                        }
                    )
                    + "\n"
                )
    return base


def test_phase_profile_flags_a_rank_15pct_slow_with_equal_cycle_counts(tmp_path):
    slow = write_ranks(tmp_path, {0: 10.0, 1: 11.5})
    sec, per_run = sections.phase_profile(slow, [run(0, 500.0, verify_ct=20)], True, True, True)
    agree = sec.fields["profile"].rank_agreement
    assert agree["ok"] is False and agree["ranks"]["1"]["cycle_ms_diff_pct"] == pytest.approx(15.0)
    assert any("ranks disagree" in w and "rank 1: 20 cycles, +15.0%" in w for w in sec.warnings)
    assert [len(c) for c in per_run] == [20]


def test_phase_profile_of_agreeing_ranks_is_complete_without_warnings(tmp_path):
    base = write_ranks(tmp_path, {0: 10.0, 1: 10.3})
    sec, _ = sections.phase_profile(base, [run(0, 500.0, verify_ct=20)], True, True, True)
    assert sec.warnings == [] and sec.fields["profile"].complete is True
    assert sec.metrics["cycle_ms"] == pytest.approx(10.0)
    # one verify more than cycles: incomplete, said so
    sec, _ = sections.phase_profile(base, [run(0, 500.0, verify_ct=21)], True, True, True)
    assert sec.fields["profile"].complete is False and sec.warnings[0].startswith("phase profile incomplete")


def test_server_env_section_warns_when_the_ranks_ran_without_the_profiles_value():
    tree = {10: {"NCCL_ALGO": "Ring"}, 11: {"NCCL_ALGO": "Tree"}, 12: {"NCCL_ALGO": "Tree"}}
    sec = sections.server_env_section({"NCCL_ALGO": "Ring"}, tree, 10, "tuned", {"NCCL_ALGO": "Ring"})
    assert sec.fields["server_env"] == {"NCCL_ALGO": "Tree"}  # the ranks', not the launcher's
    assert sec.fields["server_env_set_by_engine"] == {"NCCL_ALGO": "Tree"}
    assert sec.warnings == [
        "nccl=tuned sets NCCL_ALGO=Ring but the server's ranks ran with NCCL_ALGO=Tree "
        "(the engine's launcher rewrote it: server_env_set_by_engine)"
    ]
    same = sections.server_env_section(
        {"NCCL_ALGO": "Ring"},
        {10: {"NCCL_ALGO": "Ring"}, 11: {"NCCL_ALGO": "Ring"}},
        10,
        "tuned",
        {"NCCL_ALGO": "Ring"},
    )
    assert same.warnings == []


def test_ranks_whose_environment_reads_back_empty_are_not_counted_as_disagreeing():
    """Real SGLang 0.5.17 at tp 1 (H200, 2026-12-04): the launcher's children were the scheduler and two
    processes with an empty /proc environ; those two made every NCCL variable 'differ'."""
    tree = {
        10: {"NCCL_NVLS_ENABLE": "0"},
        11: {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"},
        12: {},
        13: {},
    }
    sec = sections.server_env_section({"NCCL_NVLS_ENABLE": "0"}, tree, 10, "default", {})
    assert sec.warnings == []
    assert sec.fields["server_env"] == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    assert sec.fields["server_env_set_by_engine"] == {"NCCL_CUMEM_ENABLE": "0"}
    # two readable ranks that disagree still warn
    tree[12] = {"NCCL_NVLS_ENABLE": "1", "NCCL_CUMEM_ENABLE": "0"}
    assert "do not share one NCCL environment" in sections.server_env_section(None, tree, 10, "default", {}).warnings[0]


def test_sglang_run_id_is_a_launch_not_a_setting():
    """SGLang writes a fresh SGLANG_RUN_ID per launch: the record's env leaves it out, so two launches of
    one setup do not differ (the drift guard read it as a provenance change on the first real run)."""
    env = {"SGLANG_RUN_ID": "sglang-run-1796362306.03-17765665", "SGLANG_SIMULATE_ACC_LEN": "2.0"}
    assert provenance.filter_env(env) == {"SGLANG_SIMULATE_ACC_LEN": "2.0"}
