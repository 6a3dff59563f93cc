"""Paired baseline: where it is on by default, where it is refused, and the per-pair speedup CI."""

import math
import os
import statistics
from pathlib import Path

import pytest
from scipy import stats as st

from spec_decode.analysis.stats import paired_ratio, ratio_of_means
from spec_decode.core.config import ConfigError

from ..conftest import compose_experiment

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


experiment = compose_experiment


def test_paired_by_default_where_two_servers_fit():
    assert experiment().paired is True  # embedded engine on the CPU
    assert experiment("benchmark.paired=false").paired is False
    assert experiment("drafter=none").paired is False  # a baseline job pairs with nothing
    assert experiment("benchmark.baseline_arm=false").paired is False
    # 8 GPUs, tp 8: one model fills the box, no room for a second server
    assert experiment("hardware=h200x8", "engine=sglang").paired is False
    # 8 GPUs, tp 2: the spec server and its baseline each get 2 of them from the slot allocator
    assert experiment("hardware=h200x8", "hardware.tp_size=2", "engine=sglang").paired is True


def test_one_baseline_strategy_per_job():
    """paired where two servers fit (the default), a separate baseline job where they do not or when asked,
    none for a baseline job or with the arm off -- never both (runner.job.run_job follows it)."""
    assert experiment().baseline_strategy == "paired"
    assert experiment("benchmark.paired=false").baseline_strategy == "job"
    assert experiment("hardware=h200x8", "engine=sglang").baseline_strategy == "job"
    assert experiment("drafter=none").baseline_strategy == "none"
    assert experiment("benchmark.baseline_arm=false").baseline_strategy == "none"


def test_forcing_pairs_where_they_cannot_fit_names_the_key():
    with pytest.raises(ConfigError, match=r"benchmark.paired=true needs 2 x hardware.tp_size = 16 GPUs"):
        experiment("hardware=h200x8", "engine=sglang", "benchmark.paired=true")


def test_paired_ratio_is_the_geometric_mean_of_pair_ratios_with_a_t_ci():
    spec = [400.0, 300.0, 500.0, 350.0, 450.0]
    base = [200.0, 160.0, 240.0, 180.0, 220.0]  # machine speed moves both arms of a pair alike
    r = paired_ratio(spec, base)
    logs = [math.log(a / b) for a, b in zip(spec, base)]
    half = st.t.ppf(0.975, 4) * statistics.stdev(logs) / math.sqrt(5)
    assert r.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (r.ci95_lo, r.ci95_hi) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half))
    )
    assert r.df == 4 and r.significant
    # the same numbers as two independent samples: the shared drift widens the CI several-fold
    welch = ratio_of_means(spec, base)
    assert (welch.ci95_hi - welch.ci95_lo) > 5 * (r.ci95_hi - r.ci95_lo)
    with pytest.raises(ValueError, match="needs pairs"):
        paired_ratio(spec, base[:4])


def test_pairing_and_server_nice_are_typed_with_errors_naming_the_key():
    assert experiment().benchmark.pairing == "interleaved"  # what docs/paired-baseline.md justifies
    assert experiment("benchmark.pairing=concurrent").benchmark.pairing == "concurrent"
    with pytest.raises(ConfigError, match=r"benchmark.pairing=abba: must be one of interleaved, concurrent"):
        experiment("benchmark.pairing=abba")
    assert experiment().benchmark.server_nice is None
    with pytest.raises(ConfigError, match=r"benchmark.server_nice=-30: must be in -20..19"):
        experiment("benchmark.server_nice=-30")


def test_preflight_refuses_concurrent_pairing_without_a_core_per_server():
    """On one usable core the two servers cannot each have their own: refused before any launch,
    naming the key and the way out."""
    from spec_decode.runner import preflight

    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})  # this process may use one core (as under taskset -c 0)
    try:
        concurrent = preflight.check(experiment("benchmark.pairing=concurrent"), ROOT)
        interleaved = preflight.check(experiment("benchmark.pairing=interleaved"), ROOT)
        unpaired = preflight.check(experiment("benchmark.pairing=concurrent", "benchmark.paired=false"), ROOT)
    finally:
        os.sched_setaffinity(0, mine)
    assert [e for e in concurrent.errors if "benchmark.pairing=concurrent" in e] == [
        f"benchmark.pairing=concurrent runs the spec and the baseline server at once, each pinned to its own "
        f"CPU cores: that needs 2 cores (2 x hardware.tp_size=1 ranks on CPU), but this job may use 1 "
        f"([{min(mine)}]); use benchmark.pairing=interleaved (or benchmark.paired=false)"
    ]
    assert not [e for e in interleaved.errors + unpaired.errors if "pairing" in e]


def test_server_cpus_parses_as_taskset_and_preflight_refuses_cores_this_job_cannot_use():
    """benchmark.server_cpus: taskset's list, refused naming the key when it does not parse; a core outside
    this job's affinity, or with concurrent pairing (which pins each arm itself), refused before any launch."""
    from spec_decode.runner import pairing, preflight

    assert experiment().benchmark.cpu_set() is None
    assert experiment("benchmark.server_cpus=2-5").benchmark.cpu_set() == {2, 3, 4, 5}
    assert experiment("benchmark.server_cpus='0,2,8-9'").benchmark.cpu_set() == {0, 2, 8, 9}
    assert experiment("benchmark.server_cpus=3").benchmark.cpu_set() == {3}
    for bad in ("5-3", "x", "1-", "-2"):
        with pytest.raises(ConfigError, match=rf"benchmark.server_cpus={bad}: a list of CPU cores as taskset -c"):
            experiment(f"benchmark.server_cpus='{bad}'")
    mine = sorted(os.sched_getaffinity(0))
    ok = preflight.check(experiment(f"benchmark.server_cpus={mine[0]}"), ROOT)
    outside = preflight.check(experiment(f"benchmark.server_cpus={mine[-1] + 1}-{mine[-1] + 2}"), ROOT)
    both = preflight.check(experiment(f"benchmark.server_cpus={mine[0]}", "benchmark.pairing=concurrent"), ROOT)
    assert not [e for e in ok.errors if "server_cpus" in e]
    assert [e for e in outside.errors if "server_cpus" in e] == [
        f"benchmark.server_cpus={mine[-1] + 1}-{mine[-1] + 2}: cores {[mine[-1] + 1, mine[-1] + 2]} are not among "
        f"the {len(mine)} this job may use ({pairing.describe_cores(mine)}); pick from those, or null"
    ]
    assert [e for e in both.errors if "server_cpus" in e] == [
        f"benchmark.server_cpus={mine[0]} with benchmark.pairing=concurrent: concurrent pairing pins each arm to "
        "its own half of the cores; use one or the other"
    ]
    assert pairing.describe_cores([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    parallel = preflight.check(experiment(f"benchmark.server_cpus={mine[0]}", "hardware.parallel_jobs=2"), ROOT)
    assert [e for e in parallel.errors if "server_cpus" in e] == [
        f"benchmark.server_cpus={mine[0]} with hardware.parallel_jobs=2: the jobs that run at once would pin their "
        "servers to the same cores; run them one at a time (hardware.parallel_jobs=1) or leave "
        "benchmark.server_cpus=null"
    ]


def test_each_pair_returns_its_spec_run_first_and_expects_the_median_duration():
    """Known-wrong inputs through the real Pairer: the arms return distinguishable runs (a swapped pair
    would turn the speedup upside down), and one 10x slow request does not move the expected time."""
    import os

    from spec_decode.runner.pairing import INTERLEAVED, Pairer

    class Run:
        def __init__(self, arm: str, wall_s: float):
            self.arm, self.wall_s = arm, wall_s

    p = Pairer(INTERLEAVED, os.getpid(), os.getpid(), expected_s={"spec": 1.0, "base": 2.0})
    walls = [(1.0, 2.0), (1.0, 2.0), (10.0, 2.0)]  # the third spec request is 10x slow
    for i, (ws, wb) in enumerate(walls):
        spec, base, info = p.run(i, lambda ws=ws: Run("spec", ws), lambda wb=wb: Run("base", wb))
        assert (spec.arm, base.arm) == ("spec", "base"), info
    assert p.expected_s == {"spec": 1.0, "base": 2.0}  # the median of 1, 1, 1, 10 -- not the last request
