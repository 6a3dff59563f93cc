"""The drift guard needs evidence: no interval alarm from fewer than 3 earlier baselines; every
provenance difference (server env, weight/data hashes, engine version) listed."""

import dataclasses

import pytest

from spec_decode.analysis import drift
from spec_decode.record.provenance import Provenance

pytestmark = pytest.mark.unit

ENV = {"NCCL_PROTO": "LL"}
LOST = "NCCL_PROTO was LL in the earlier runs, unset now"
HASHES = {"target": "aaaa1111", "prompts": "bbbb2222"}


def ref(tput: float, started: float, env=None, hashes=None, version="0.1.0") -> drift.Reference:
    return drift.Reference(
        f"r{started}",
        tput,
        started,
        (tput - 5, tput + 5),
        dict(ENV if env is None else env),
        dict(HASHES if hashes is None else hashes),
        version,
    )


EARLIER = [ref(600.0, 1), ref(610.0, 2), ref(590.0, 3)]


@pytest.mark.parametrize("n", [1, 2])
def test_fewer_than_three_earlier_baselines_raise_no_interval_alarm(n):
    """The issue's case: 585.3 tok/s against one earlier baseline's CI [599.4, 623.3] was an alarm."""
    f = drift.check(400.0, ENV, EARLIER[:n], HASHES, "0.1.0")  # far below anything earlier
    assert f.interval_tok_s is None and f.outside_interval is False
    assert f.message is None
    assert f.note.startswith(f"too few earlier baselines ({n} < 3)")


def test_three_earlier_baselines_give_an_interval_and_an_alarm():
    f = drift.check(400.0, ENV, EARLIER, HASHES, "0.1.0")
    # mean 600, sd 10, n 3: 600 +- t(0.975, 2) x 10 x sqrt(4/3) = 600 +- 49.7
    assert f.interval_tok_s == pytest.approx([600 - 49.68, 600 + 49.68], abs=0.01)
    assert f.outside_interval and f.note is None
    assert f.message.startswith("DRIFT: baseline 400.0 tok/s is outside the 3 earlier baselines' interval")
    assert f.message.endswith("no provenance difference found")
    inside = drift.check(605.0, ENV, EARLIER, HASHES, "0.1.0")
    assert inside.message is None and not inside.outside_interval


def test_a_baseline_15pct_fast_is_outside_the_interval_too():
    """The interval has two sides: 690 tok/s against 600 +- 49.7 is drift as much as 400 is."""
    f = drift.check(690.0, ENV, EARLIER, HASHES, "0.1.0")
    assert f.outside_interval and f.message.startswith("DRIFT: baseline 690.0 tok/s is outside")
    assert not drift.check(645.0, ENV, EARLIER, HASHES, "0.1.0").outside_interval  # inside, just


def test_a_hash_only_one_side_knows_is_no_difference():
    """An older record without the prompts' hash is no evidence that the prompts changed."""
    older = [
        ref(600.0, 1, hashes={"target": "aaaa1111"}),
        ref(610.0, 2, hashes={"target": "aaaa1111"}),
        ref(590.0, 3, hashes={"target": "aaaa1111"}),
    ]
    f = drift.check(605.0, ENV, older, HASHES, "0.1.0")
    assert f.provenance_differences == [] and f.message is None


def test_changed_weight_hash_is_listed_even_when_throughput_looks_normal():
    rebuilt = {**HASHES, "target": "cccc3333"}
    f = drift.check(605.0, ENV, EARLIER, rebuilt, "0.1.0")
    assert f.provenance_differences == ["target hash was aaaa1111 in the earlier runs, cccc3333 now"]
    assert f.message.startswith("DRIFT: baseline throughput 605.0 tok/s looks normal, but the provenance changed")
    assert "target hash was aaaa1111" in f.message
    out = drift.check(400.0, ENV, EARLIER, rebuilt, "0.1.0")
    assert "outside" in out.message and "no provenance difference found" not in out.message
    # with one earlier baseline: no interval, but the hash change is still a finding
    one = drift.check(400.0, ENV, EARLIER[:1], rebuilt, "0.1.0")
    assert "too few earlier baselines" in one.message and "target hash" in one.message


def test_engine_version_and_environment_differences_are_listed():
    f = drift.check(605.0, {}, EARLIER, HASHES, "0.2.0")
    assert f.env_differences == ["NCCL_PROTO was LL in the earlier runs, unset now"]
    assert f.provenance_differences == ["engine version was 0.1.0 in the earlier runs, 0.2.0 now"]
    assert "NCCL_PROTO was LL" in f.message and "engine version was 0.1.0" in f.message


def test_the_newest_earlier_run_is_the_provenance_reference():
    newest = ref(600.0, 9, env={"NCCL_PROTO": "Simple"}, hashes={**HASHES, "prompts": "dddd4444"})
    f = drift.check(605.0, ENV, [*EARLIER, newest], HASHES, "0.1.0")
    assert f.env_differences == ["NCCL_PROTO was Simple in the earlier runs, LL now"]
    assert f.provenance_differences == ["prompts hash was dddd4444 in the earlier runs, bbbb2222 now"]


def test_nothing_earlier_is_no_finding():
    assert drift.check(300.0, ENV, [], HASHES, "0.1.0") is None


def test_identity_leaves_engine_version_weights_and_nccl_to_the_findings():
    cfg = {
        "hardware": {"name": "cpu"},
        "model": {"name": "tiny"},
        "engine": {"name": "embedded"},
        "nccl": {"name": "default"},
        "benchmark": {"max_new_tokens": 500, "prompts": "p", "prompt_index": 0},
    }
    assert drift.identity(cfg) == {
        "hardware": "cpu",
        "hardware.tp_size": 1,
        "model": "tiny",
        "engine": "embedded",
        "benchmark.max_new_tokens": 500,
        "benchmark.prompts": "p",
        "benchmark.prompt_index": 0,
    }
    # the serving options and the load, where the config has them: another value is another setup
    cfg["engine"].update(disable_overlap_schedule=True, extra_args=["--x"], startup_timeout_s=60)
    cfg["benchmark"].update(concurrency=8, runs=3)
    ident = drift.identity(cfg)
    assert ident["engine.disable_overlap_schedule"] is True and ident["engine.extra_args"] == ["--x"]
    assert ident["benchmark.concurrency"] == 8
    assert "engine.startup_timeout_s" not in ident and "benchmark.runs" not in ident  # no effect on speed
    # an option added later: at its default it is left out, so a record from before it still matches
    before = drift.identity(cfg)
    cfg["engine"]["proj_split"] = 0
    assert drift.identity(cfg) == before
    cfg["engine"]["proj_split"] = 4
    assert drift.identity(cfg)["engine.proj_split"] == 4
    assert drift.data_hashes_of(
        Provenance(data={"target": {"dvc_md5": "m1"}, "prompts": {"sha256": "s1"}, "x": {"missing": True}})
    ) == {"target": "m1", "prompts": "s1", "x": "missing"}


def test_another_nccl_profile_is_a_finding_and_the_interval_takes_only_like_runs():
    """Issue 44: the same key measured earlier with nccl=tuned, now nccl=default (the seed's incident)."""
    tuned = [dataclasses.replace(r, nccl="tuned") for r in EARLIER]  # 600 +- 10 tok/s with NCCL_PROTO=LL
    f = drift.check(400.0, {}, tuned, HASHES, "0.1.0", nccl="default")
    assert f.env_differences == ["nccl=tuned in the earlier runs, nccl=default now", LOST]
    assert f.message.startswith("DRIFT: ") and LOST in f.message
    # 400 is far below the tuned runs, but they measured another setup: no interval of this profile yet
    assert f.interval_tok_s is None and not f.outside_interval and f.note.startswith("too few earlier baselines (0")
    same = drift.check(400.0, ENV, tuned, HASHES, "0.1.0", nccl="tuned")
    assert same.outside_interval and same.env_differences == []
    # a paired job's baseline arm is compared with baseline jobs' environments, not their interval
    arm = drift.check(400.0, ENV, tuned, HASHES, "0.1.0", nccl="tuned", paired=True)
    assert arm.interval_tok_s is None and arm.message is None


def test_the_spec_servers_own_variables_and_the_drafter_are_no_baseline_drift():
    paired = [ref(600.0, 1, env={**ENV, "SGLANG_SIMULATE_ACC_LEN": "2.5"}, hashes={**HASHES, "drafter": "d1"})]
    paired[0].paired = True
    f = drift.check(600.0, ENV, paired, {**HASHES, "drafter": "d2"}, "0.1.0")  # a baseline job after it
    assert f.env_differences == [] and f.provenance_differences == [] and f.message is None
    g = drift.check(600.0, ENV, paired, HASHES, "0.1.0", paired=True)  # a paired job: same kind, compared
    assert g.env_differences == ["SGLANG_SIMULATE_ACC_LEN was 2.5 in the earlier runs, unset now"]
