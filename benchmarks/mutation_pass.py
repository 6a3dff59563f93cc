"""The mutation pass (docs/testing-mutation.md): plant one bug at a time in agreement, pairing, guard and
re-entrancy logic, run the tests for that claim, say whether they caught it (failed) or missed it (passed).

    python benchmarks/mutation_pass.py            # each mutant against the tests that guard it now
    python benchmarks/mutation_pass.py --named    # against the test named for the claim before the pass
    python benchmarks/mutation_pass.py --only R1,P3

Each bug is a temporary edit of one file, restored from the text read before it (also on Ctrl-C); run it
on a clean tree and let nothing else import the package meanwhile (a server started mid-pass would load
the mutant). Prints one line per mutant and the totals; exits 1 when a mutant survives its "now" tests.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Mutant:
    id: str
    claim: str
    file: str
    old: str | list[str]  # the text replaced (a list: several edits of one file, one bug)
    new: str | list[str]
    named: list[str]  # the test named for the claim before the pass
    now: list[str]  # the tests that guard it now


MUTANTS = [
    Mutant(
        "R1",
        "rank agreement: a rank's mean cycle more than 10% from rank 0's disagrees",
        "spec_decode/parsers/profile.py",
        "ok = ok and same_count and abs(diff) <= tolerance_pct",
        "ok = ok and same_count",
        named=["tests/unit/test_profiler.py::test_rank_files_and_agreement"],
        now=[
            "tests/unit/test_profiler.py::test_rank_files_and_agreement",
            "tests/unit/test_profiler.py::test_a_rank_15pct_slow_with_equal_cycle_counts_disagrees",
            "tests/unit/test_sections.py::test_phase_profile_flags_a_rank_15pct_slow_with_equal_cycle_counts",
        ],
    ),
    Mutant(
        "R2",
        "rank agreement: unequal cycle counts disagree",
        "spec_decode/parsers/profile.py",
        "ok = ok and same_count and abs(diff) <= tolerance_pct",
        "ok = ok and abs(diff) <= tolerance_pct",
        named=["tests/unit/test_profiler.py::test_rank_files_and_agreement"],
        now=["tests/unit/test_profiler.py::test_rank_files_and_agreement"],
    ),
    Mutant(
        "R3",
        "rank agreement: the difference is relative to the reference rank",
        "spec_decode/parsers/profile.py",
        '100.0 * (s["cycle_ms"] - base["cycle_ms"]) / base["cycle_ms"]',
        '100.0 * (s["cycle_ms"] - base["cycle_ms"]) / s["cycle_ms"]',
        named=["tests/unit/test_profiler.py::test_rank_files_and_agreement"],
        now=["tests/unit/test_profiler.py::test_rank_files_and_agreement"],
    ),
    Mutant(
        "R4",
        "rank agreement: disagreeing ranks are a warning on the record",
        "spec_decode/analysis/sections.py",
        'if agreement and not agreement["ok"]:',
        'if agreement and agreement["ok"]:',
        named=["tests/unit/test_profiler.py::test_rank_files_and_agreement", "tests/unit/test_record.py"],
        now=[
            "tests/unit/test_profiler.py::test_rank_files_and_agreement",
            "tests/unit/test_record.py",
            "tests/unit/test_sections.py::test_phase_profile_flags_a_rank_15pct_slow_with_equal_cycle_counts",
        ],
    ),
    Mutant(
        "P1",
        "pairing: interleaved pairs alternate their order (ABBA)",
        "spec_decode/runner/pairing.py",
        "order = [BASE, SPEC] if i % 2 == 0 else [SPEC, BASE]",
        "order = [BASE, SPEC]",
        named=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
        now=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
    ),
    Mutant(
        "P2",
        "pairing: each pair returns (spec run, baseline run), never swapped",
        "spec_decode/runner/pairing.py",
        "return out[SPEC], out[BASE], info",
        "return out[BASE], out[SPEC], info",
        named=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
        now=[
            "tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates",
            "tests/unit/test_paired.py::test_each_pair_returns_its_spec_run_first_and_expects_the_median_duration",
        ],
    ),
    Mutant(
        "P3",
        "pairing: the speedup takes pair i = (runs[i], baseline_runs[i])",
        "spec_decode/analysis/sections.py",
        "base_tput = [r.throughput_tok_s for r in paired_runs[:n]]",
        "base_tput = [r.throughput_tok_s for r in paired_runs[:n]][::-1]",
        named=["tests/unit/test_paired.py", "tests/unit/test_record.py"],
        now=[
            "tests/unit/test_paired.py",
            "tests/unit/test_record.py",
            "tests/unit/test_sections.py::test_speedup_pairs_runs_in_order_and_falls_back_to_welch_only_without_pairs",
        ],
    ),
    Mutant(
        "P4",
        "pairing: each arm starts so that both share the longest arm's midpoint",
        "spec_decode/runner/pairing.py",
        "return {arm: max(0.0, (longest - s) / 2) for arm, s in expected_s.items()}",
        "return {arm: max(0.0, (longest - s)) for arm, s in expected_s.items()}",
        named=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
        now=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
    ),
    Mutant(
        "P5",
        "pairing: expected durations are the median so far, not the last request",
        "spec_decode/runner/pairing.py",
        "self.expected_s = {arm: statistics.median(v) for arm, v in self._seen.items()}",
        "self.expected_s = {arm: v[-1] for arm, v in self._seen.items()}",
        named=["tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates"],
        now=[
            "tests/integration/test_pairing.py::test_midpoints_align_and_interleaved_order_alternates",
            "tests/unit/test_paired.py::test_each_pair_returns_its_spec_run_first_and_expects_the_median_duration",
        ],
    ),
    Mutant(
        "D1",
        "drift guard: a baseline outside the interval on either side alarms",
        "spec_decode/analysis/drift.py",
        "outside = iv is not None and not (iv[0] <= throughput_tok_s <= iv[1])",
        "outside = iv is not None and throughput_tok_s < iv[0]",
        named=["tests/unit/test_drift.py"],
        now=[
            "tests/unit/test_drift.py",
            "tests/unit/test_drift.py::test_a_baseline_15pct_fast_is_outside_the_interval_too",
        ],
    ),
    Mutant(
        "D2",
        "drift guard: no interval alarm from fewer than 3 earlier baselines",
        "spec_decode/analysis/drift.py",
        "MIN_EARLIER = 3",
        "MIN_EARLIER = 2",
        named=["tests/unit/test_drift.py"],
        now=["tests/unit/test_drift.py"],
    ),
    Mutant(
        "D3",
        "drift guard: a prediction interval for a new mean (sqrt(1 + 1/n)), not a CI of the mean",
        "spec_decode/analysis/drift.py",
        "math.sqrt(1 + 1 / n)",
        "math.sqrt(1 / n)",
        named=["tests/unit/test_drift.py"],
        now=["tests/unit/test_drift.py"],
    ),
    Mutant(
        "D4",
        "drift guard: the newest earlier run is the provenance reference",
        "spec_decode/analysis/drift.py",
        "key=lambda r: r.started_at, reverse=True)",
        "key=lambda r: r.started_at)",
        named=["tests/unit/test_drift.py"],
        now=["tests/unit/test_drift.py"],
    ),
    Mutant(
        "D5",
        "drift guard: a hash only one side knows is no evidence of a change",
        "spec_decode/analysis/drift.py",
        "for name in sorted(set(ref.data_hashes) & set(data_hashes) - set(NOT_BASELINE_INPUTS)):\n"
        "        a, b = ref.data_hashes[name], data_hashes[name]",
        "for name in sorted((set(ref.data_hashes) | set(data_hashes)) - set(NOT_BASELINE_INPUTS)):\n"
        "        a, b = ref.data_hashes.get(name, 'missing'), data_hashes.get(name, 'missing')",
        named=["tests/unit/test_drift.py"],
        now=["tests/unit/test_drift.py", "tests/unit/test_drift.py::test_a_hash_only_one_side_knows_is_no_difference"],
    ),
    Mutant(
        "D6",
        "drift guard: only a job that measured a baseline is checked (a baseline job or a paired arm)",
        "spec_decode/analysis/finish.py",
        '"baseline_throughput_tok_s" if rec.baseline_runs else None',
        '"throughput_tok_s"',
        named=["tests/unit/test_record.py"],
        now=["tests/unit/test_record.py"],
    ),
    Mutant(
        "S1",
        "SIGTERM drain: a second SIGTERM mid-drain starts no nested drain",
        "spec_decode/profiler/plugin.py",
        "        if flushing.is_set():\n            return\n        flushing.set()",
        "        flushing.set()",
        named=["tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle"],
        now=[
            "tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle",
            "tests/unit/test_profiler.py::test_a_second_sigterm_mid_drain_starts_no_nested_drain",
            "tests/unit/test_profiler.py::test_the_previous_handler_runs_once_when_the_cycle_ends_before_the_wait",
        ],
    ),
    Mutant(
        "S2",
        "SIGTERM drain: the cycle's end and the wait's timer finish once",
        "spec_decode/profiler/plugin.py",
        "        if not done.acquire(blocking=False):\n            return  # the cycle's end and the wait's timer both got here: once",
        "        pass",
        named=["tests/unit/test_profiler.py::test_sigterm_inside_a_cycle_waits_for_it_to_be_recorded"],
        now=[
            "tests/unit/test_profiler.py::test_sigterm_inside_a_cycle_waits_for_it_to_be_recorded",
            "tests/unit/test_profiler.py::test_the_previous_handler_runs_once_when_the_cycle_ends_before_the_wait",
        ],
    ),
    Mutant(
        "S12",
        "SIGTERM drain: a second SIGTERM mid-drain neither drains again nor duplicates lines (S1 + S2 together)",
        "spec_decode/profiler/plugin.py",
        [
            "        if flushing.is_set():\n            return\n        flushing.set()",
            "        if not done.acquire(blocking=False):\n            return  # the cycle's end and the wait's timer both got here: once",
        ],
        ["        flushing.set()", "        pass"],
        named=["tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle"],
        now=[
            "tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle",
            "tests/unit/test_profiler.py::test_a_second_sigterm_mid_drain_starts_no_nested_drain",
        ],
    ),
    Mutant(
        "S3",
        "SIGTERM drain: lines leave the queue only after they are written",
        "spec_decode/profiler/timer.py",
        '                with open(self.path, "a", encoding="utf-8") as f:\n                    f.writelines(json.dumps(x) + "\\n" for x in lines)\n                for _ in lines:\n                    self._pending.popleft()',
        '                for _ in lines:\n                    self._pending.popleft()\n                with open(self.path, "a", encoding="utf-8") as f:\n                    f.writelines(json.dumps(x) + "\\n" for x in lines)',
        named=["tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle"],
        now=[
            "tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle",
            "tests/unit/test_profiler.py::test_cycles_leave_the_queue_only_once_they_are_written",
        ],
    ),
    Mutant(
        "S4",
        "SIGTERM drain: a cycle written twice by an interrupted drain reads as one",
        "spec_decode/parsers/profile.py",
        "        if line in seen:\n            continue\n",
        "",
        named=["tests/unit/test_profiler.py::test_a_line_written_twice_by_an_interrupted_drain_is_one_cycle"],
        now=["tests/unit/test_profiler.py::test_a_line_written_twice_by_an_interrupted_drain_is_one_cycle"],
    ),
    Mutant(
        "S5",
        "SIGTERM drain: the process still dies by SIGTERM after the drain",
        "spec_decode/profiler/plugin.py",
        "            os.kill(os.getpid(), signal.SIGTERM)",
        "            pass",
        named=["tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle"],
        now=["tests/unit/test_profiler.py::test_two_sigterms_lose_no_cycle"],
    ),
]


def planted(m: Mutant, text: str) -> str:
    olds, news = (m.old, m.new) if isinstance(m.old, list) else ([m.old], [m.new])
    for o, n in zip(olds, news):
        if text.count(o) != 1:
            raise SystemExit(f"{m.id}: {m.file} no longer holds the text to mutate once; update the mutant")
        text = text.replace(o, n)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--named", action="store_true", help="run the tests named for each claim before the pass")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    caught = missed = 0
    for m in MUTANTS:
        if only and m.id not in only:
            continue
        path = ROOT / m.file
        orig = path.read_text()
        tests = m.named if args.named else m.now
        t0 = time.monotonic()
        try:
            path.write_text(planted(m, orig))
            p = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            path.write_text(orig)
        ok = p.returncode != 0
        caught, missed = caught + ok, missed + (not ok)
        print(f"{m.id:4} {'caught' if ok else 'MISSED'} {time.monotonic() - t0:5.1f} s  {m.claim}", flush=True)
    print(f"{caught} caught, {missed} missed")
    return 1 if missed and not args.named else 0


if __name__ == "__main__":
    sys.exit(main())
