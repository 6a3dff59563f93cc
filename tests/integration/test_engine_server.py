"""The embedded engine as a real server process over real HTTP: SGLang's contract, bad input."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from spec_decode.parsers.decode_log import read_log, summarize
from spec_decode.parsers.profile import read_ranks

from ..conftest import DRAFTER, TARGET
from .engine_args import ENGINE, embedded_server, spec_flags

pytestmark = pytest.mark.integration
SPEC = spec_flags(3)
BODY = {
    "text": "The old robot sleeps in the garden. ",
    "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
}


@pytest.fixture(scope="class")
def spec_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec_server")
    with embedded_server(
        d / "server.log",
        *SPEC,
        "--decode-log-interval",
        "5",
        env={"SPEC_DECODE_PROFILE": str(d / "profile.jsonl")},
        startup_timeout_s=60,
    ) as srv:
        yield srv, d


class TestSpecServer:
    def test_generate_returns_sglang_meta_info(self, spec_server):
        srv, _ = spec_server
        r = requests.post(srv.base_url + "/generate", json=BODY, timeout=30)
        assert r.status_code == 200
        out = r.json()
        meta = out["meta_info"]
        assert meta["completion_tokens"] == 64 == len(out["output_ids"])
        assert meta["finish_reason"] == {"type": "length", "length": 64}
        assert meta["spec_verify_ct"] > 0
        assert meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
        assert meta["spec_num_proposed_drafts"] == 3 * meta["spec_verify_ct"]
        assert 0 <= meta["spec_num_correct_drafts"] <= meta["spec_num_proposed_drafts"]
        assert out["text"] and isinstance(meta["e2e_latency"], float)

    def test_server_info_and_flush_cache_reset_counters(self, spec_server):
        srv, _ = spec_server
        requests.post(srv.base_url + "/generate", json=BODY, timeout=30)
        info = requests.get(srv.base_url + "/server_info", timeout=5).json()
        assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
        assert info["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1
        assert requests.post(srv.base_url + "/flush_cache", timeout=5).status_code == 200
        info = requests.get(srv.base_url + "/server_info", timeout=5).json()
        assert info["internal_states"][0]["avg_spec_accept_length"] is None

    def test_decode_log_and_profile_lines(self, spec_server):
        """The profiler plugin, loaded by the engine's rank process, times every cycle of a request."""
        srv, d = spec_server
        t0 = time.time()
        r = requests.post(srv.base_url + "/generate", json=BODY, timeout=30).json()
        lines = [x for x in read_log(d / "server.log") if x.kind == "Decode"]
        assert lines and "accept len" in lines[-1].fields and lines[-1].fields["cpu graph"] is False
        assert summarize(lines).accept_len_median > 1
        deadline = time.monotonic() + 10  # the plugin's flusher writes within ~50 ms of a cycle
        while time.monotonic() < deadline:
            prof = [c for c in read_ranks(d / "profile.jsonl").get(0, []) if c["t"] >= t0]
            if len(prof) >= r["meta_info"]["spec_verify_ct"]:
                break
            time.sleep(0.1)
        time.sleep(0.3)  # the flusher's next pass: an in-flight cycle after the counted ones
        prof = [c for c in read_ranks(d / "profile.jsonl").get(0, []) if c["t"] >= t0]
        # the counted verifies, then SGLang's uncounted in-flight cycle (overlap scheduler) iff the
        # finishing result was not foreseeable when the next batch was scheduled:
        # len(output_ids) + 1 < max_new_tokens then (scheduler.py 4444-4457)
        v = r["meta_info"]["spec_verify_ct"]
        before_last = 1 + sum(p["accepted"] for p in prof[: v - 1])
        assert len(prof) == v + (before_last + 1 < 64), (len(prof), v)
        assert set(prof[0]) == {
            "t",
            "t0",
            "rank",
            "tp",
            "dp",
            "attn_dp",
            "rids",
            "draft_ms",
            "verify_ms",
            "extend_ms",
            "cycle_ms",
            "accepted",
            "accept_lens",
        }
        assert all(len(p["rids"]) == len(p["accept_lens"]) == 1 and p["accepted"] == p["accept_lens"][0] for p in prof)
        # the engine's request id is the request's own (meta_info.id, SGLang's Req.rid): what the
        # profile's attribution matches the client's records by
        assert {p["rids"][0] for p in prof} == {r["meta_info"]["id"]}
        # entry and exit stamps of each cycle on the wall clock: in order, and the cycle's own duration fits
        assert all(p["t0"] < p["t"] and (p["t"] - p["t0"]) * 1e3 >= 0.9 * p["cycle_ms"] for p in prof)
        assert all(1 <= p["accepted"] <= 4 and p["rank"] == 0 for p in prof)
        # The prefill made the first token; the last counted cycle may commit up to steps (3) past the 64.
        assert 64 - 1 <= sum(p["accepted"] for p in prof[:v]) <= 64 - 1 + 3

    def test_a_request_rid_is_the_engines_id(self, spec_server):
        srv, d = spec_server
        t0 = time.time()
        r = requests.post(srv.base_url + "/generate", json={**BODY, "rid": "my-rid-1"}, timeout=30).json()
        assert r["meta_info"]["id"] == "my-rid-1"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            prof = [c for c in read_ranks(d / "profile.jsonl").get(0, []) if c["t"] >= t0]
            if len(prof) >= r["meta_info"]["spec_verify_ct"]:
                break
            time.sleep(0.1)
        assert prof and {c["rids"][0] for c in prof} == {"my-rid-1"}

    def test_a_rid_still_running_is_a_400_naming_it_streamed_or_not(self, spec_server):
        """Two requests with one rid would share the ranks' key (the second answer would go to the first
        caller): while a request runs, its rid is refused with 400 naming it, also for a stream (before
        any 200), and taken again once the request is done."""
        srv, _ = spec_server
        long = {
            **BODY,
            "rid": "dup-1",
            "stream": True,
            "sampling_params": {**BODY["sampling_params"], "max_new_tokens": 900},
        }
        with requests.post(srv.base_url + "/generate", json=long, timeout=60, stream=True) as first:
            lines = first.iter_lines()
            assert first.status_code == 200 and next(line for line in lines if line).startswith(b"data: {")
            for extra in ({}, {"stream": True}):  # the first is running: its first event is out
                r = requests.post(srv.base_url + "/generate", json={**BODY, "rid": "dup-1", **extra}, timeout=30)
                assert r.status_code == 400, (extra, r.status_code, r.text[:300])
                assert "rid 'dup-1'" in r.json()["error"]["message"] and "still running" in r.text
            done = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")][-1]
        assert done["meta_info"]["id"] == "dup-1" and done["meta_info"]["completion_tokens"] == 900
        again = requests.post(srv.base_url + "/generate", json={**BODY, "rid": "dup-1"}, timeout=30)
        assert again.status_code == 200 and again.json()["meta_info"]["id"] == "dup-1"

    @pytest.mark.parametrize(
        "body,named",
        [
            ({"text": "hi", "sampling_params": {"max_tokens": 5}}, "max_tokens"),
            ({"text": "hi", "sampling_params": {"max_new_tokens": 5, "temperature": 0.8}}, "temperature"),
            ({"text": "hi", "sampling_params": {"max_new_tokens": 5000, "temperature": 0}}, "max_new_tokens"),
            ({"text": "x" * 1100, "sampling_params": {"max_new_tokens": 5, "temperature": 0}}, "context"),
            ({"sampling_params": {"max_new_tokens": 5, "temperature": 0}}, "text"),
            ({"input_ids": [1, 999], "sampling_params": {"temperature": 0}}, "input_ids"),
        ],
    )
    def test_bad_requests_get_400_naming_the_key_and_server_keeps_serving(self, spec_server, body, named):
        srv, _ = spec_server
        r = requests.post(srv.base_url + "/generate", json=body, timeout=10)
        assert r.status_code == 400
        assert named in r.json()["error"]["message"]
        assert requests.post(srv.base_url + "/generate", json=BODY, timeout=30).status_code == 200

    def test_with_the_profiler_the_front_registers_its_hooks_without_torch(self, spec_server):
        """SPEC_DECODE_PROFILE set: the front loads the plugin (its log says so) but applies no hook: they
        target decoding, which it never runs, and importing it cost ~1.4 s of CPU per launch (torch). The
        rank, which decodes, has torch and applied them."""
        srv, d = spec_server
        (rank,) = requests.get(srv.base_url + "/server_info", timeout=5).json()["rank_pids"]
        assert libtorch_mapped(rank) and not libtorch_mapped(srv.pid)
        text = (d / "server.log").read_text()
        assert f"front (pid {srv.pid}): plugins loaded: ['spec_decode_profiler']" in text
        assert "Applied 1 hook(s) to spec_decode.engines.embedded.decoding.Decoder.cycle" in text  # the rank's

    def test_malformed_json_is_400(self, spec_server):
        srv, _ = spec_server
        r = requests.post(srv.base_url + "/generate", data=b"{not json", timeout=10)
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def baseline_server(tmp_path_factory):
    """One baseline server (no speculation) for the three tests below, started without SPEC_DECODE_PROFILE
    (the server inherits our environment): the torch test needs the front as it runs without the
    profiler, the spec-fields and the streaming tests any baseline server. One launch, not three (the
    streaming test was test_engine_streaming.py's, with a baseline server of its own)."""
    d = tmp_path_factory.mktemp("baseline_server")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SPEC_DECODE_PROFILE", raising=False)
        srv = embedded_server(d / "server.log", startup_timeout_s=60).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_baseline_server_has_no_spec_fields(baseline_server):
    out = requests.post(baseline_server.base_url + "/generate", json=BODY, timeout=30).json()
    assert out["meta_info"]["completion_tokens"] == 64
    assert not [k for k in out["meta_info"] if k.startswith("spec_")]


def test_baseline_server_streams_one_decode_step_per_event(baseline_server):
    from .test_engine_streaming import BODY as STREAM_BODY
    from .test_engine_streaming import N, read_events

    srv = baseline_server
    events = read_events(requests.post(srv.base_url + "/generate", json={**STREAM_BODY, "stream": True}, timeout=60))
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(set(counts)) and counts[0] >= 1 and counts[-1] == N
    assert len(events) >= N // 4, counts  # one token per step; a writer behind coalesces a few steps
    assert events[-1]["output_ids"][: len(events[-2]["output_ids"])] == events[-2]["output_ids"]
    assert not [k for k in events[-1]["meta_info"] if k.startswith("spec_")]


def libtorch_mapped(pid: int) -> bool:
    """Whether torch's shared library is mapped into process ``pid`` (torch imported there)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_the_front_never_loads_torch_without_the_profiler(baseline_server):
    """The front (HTTP, rank group) computes nothing with torch: importing it cost each server ~1 s of CPU
    (docs/testing.md). Only its rank loads torch -- seen through the same check, so a check that cannot
    see torch would fail here too. The module's baseline server was started without SPEC_DECODE_PROFILE."""
    srv = baseline_server
    r = requests.post(srv.base_url + "/generate", json=BODY, timeout=30)
    assert r.status_code == 200
    (rank,) = requests.get(srv.base_url + "/server_info", timeout=5).json()["rank_pids"]
    assert libtorch_mapped(rank)
    assert not libtorch_mapped(srv.pid), "the front imported torch (python -X importtime shows through what)"


RANK_WORK = """
import sys
from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_drafter, load_target
target = load_target(sys.argv[1])
drafter = load_drafter(sys.argv[2], target)
Decoder(target, drafter, 3, None, None).generate([32] * 8, 8)
print(" ".join(sorted(m for m in sys.modules if m.startswith("torch._dynamo"))) or "none")
"""


def test_a_rank_on_cpu_never_imports_torch_dynamo():
    """What a rank does before it is ready (scheduler.run_rank: the loaders build on the meta device and
    assign the checkpoint, then the warm-up generate) never imports torch._dynamo. torch's own init of a
    meta tensor (nn.Embedding's normal_, RoPE's arange) runs reference decompositions that import it:
    1.3-1.7 s of CPU in every rank that never compiles, ~13% of the suite (docs/testing.md)."""
    out = subprocess.run(
        [sys.executable, "-c", RANK_WORK, str(TARGET), str(DRAFTER)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none"], f"a rank imported {out.stdout.strip()} (python -X importtime: through what)"


def start(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ENGINE + args, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )


def _drafter_copy(tmp_path, edit) -> str:
    import shutil

    d = tmp_path / "drafter"
    shutil.copytree(DRAFTER, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@pytest.mark.parametrize(
    "case", ["unknown_flag", "partial_spec", "topk", "compile_on_cpu", "split_uncompiled", "split_one", "split_below_0"]
)
def test_bad_flags_exit_2_naming_the_flag(case):
    args = {
        "unknown_flag": ["--model-path", str(TARGET), "--cuda-graph-max-bs", "8"],
        "partial_spec": [
            "--model-path",
            str(TARGET),
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(DRAFTER),
            "--speculative-eagle-topk",
            "1",
        ],
        "topk": [
            "--model-path",
            str(TARGET),
            *SPEC[:-4],
            "--speculative-eagle-topk",
            "4",
            "--speculative-num-draft-tokens",
            "8",
        ],
        # compiles the static path's shapes: not on CPU's dynamic path (--static-path or --device cuda)
        "compile_on_cpu": ["--model-path", str(TARGET), "--enable-torch-compile"],
        # o/down as partials: their sum is fused by torch.compile, so not without it
        "split_uncompiled": ["--model-path", str(TARGET), "--static-path", "--proj-split", "4"],
        "split_one": ["--model-path", str(TARGET), "--static-path", "--enable-torch-compile", "--proj-split", "1"],
        "split_below_0": ["--model-path", str(TARGET), "--proj-split", "-1"],
    }[case]
    named = {
        "compile_on_cpu": "--enable-torch-compile",
        "unknown_flag": "--cuda-graph-max-bs",
        "partial_spec": "--speculative-num-steps",
        "topk": "--speculative-eagle-topk",
        "split_uncompiled": "--proj-split 4 needs --enable-torch-compile",
        "split_one": "--proj-split must be 0 (off) or >= 2 (got 1",
        "split_below_0": "--proj-split must be 0 (off) or >= 2 (got -1",
    }[case]
    p = start(args)
    assert p.returncode == 2
    assert named in p.stderr


def test_a_split_the_targets_projections_cannot_take_is_refused_before_any_rank_starts():
    # the tiny target: o_proj's input 192 a row, down_proj's 512; 3 divides only the first
    p = start(["--model-path", str(TARGET), "--static-path", "--enable-torch-compile", "--proj-split", "3"])
    assert p.returncode == 1
    assert (
        "--proj-split 3: o_proj's input width (192) and down_proj's (512) must both divide by it; use one of 2, 4, 8, 16"
        in p.stderr
    )
    assert "rank" not in p.stderr.lower()  # refused at the front, before a rank (and its compile) started


def test_missing_model_dir_says_dvc_pull(tmp_path):
    p = start(["--model-path", str(tmp_path / "nope")])
    assert p.returncode == 1
    assert "dvc pull" in p.stderr and "nope" in p.stderr


@pytest.mark.parametrize(
    "edit,named",
    [
        (lambda c: c.update(architectures=["LlamaForCausalLM"]), "LlamaForCausalLMEagle3"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 9]), "0..4"),
        # spec_decode.core.drafter's shape rules (preflight's): the engine refuses them itself, not a rank's
        # load_state_dict traceback after the processes started
        (lambda c: c.update(vocab_size=300, draft_vocab_size=300), "vocab_size 300 != target vocab_size 256"),
        (lambda c: c.update(hidden_size=96, target_hidden_size=192), "hidden_size 96 must equal the target's 192"),
    ],
    ids=["not_eagle3", "layer_ids_out_of_range", "vocab_mismatch", "hidden_mismatch"],
)
def test_bad_drafter_exits_1_with_a_message(tmp_path, edit, named):
    d = _drafter_copy(tmp_path, edit)
    p = start(["--model-path", str(TARGET), *SPEC[:2], "--speculative-draft-model-path", d, *SPEC[4:]])
    assert p.returncode == 1
    assert named in p.stderr
    # the file to fix and what to do, before any process of the server started
    assert f"{d}/config.json" in p.stderr and "what to do:" in p.stderr
    assert "plugins loaded" not in p.stdout
