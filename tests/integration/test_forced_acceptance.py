"""Forced acceptance (spec.simulate_accept_len -> SGLANG_SIMULATE_ACC_LEN) on the embedded engine: real
server processes over HTTP (tp 1 and tp 2), the CUDA path's StaticRunner run eagerly on CPU, and a
real job whose record and MLflow run say performance-only."""

import json
import os
import subprocess

import mlflow
import pytest
import requests

from spec_decode.engines.embedded.decoding import FILL_TOKEN, Decoder, ForcedAcceptance
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.engines.server_process import free_port

from ..conftest import ROOT, TARGET, run_py, small
from .engine_args import ENGINE, embedded_server, spec_flags, tiny_models

pytestmark = pytest.mark.integration
STEPS = 3
SPEC = [*spec_flags(STEPS), "--random-seed", "7"]
PROMPT = "The old robot sleeps in the garden. "
N = 240
BODY = {"text": PROMPT, "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}}
# Tolerance of a measured accept length against the forced one: an integer is exact but for the last
# cycle's truncation (N tokens over ceil((N-1)/x) cycles); a fraction is a mean of ~90 Bernoulli draws
# (sd 0.5/sqrt(90) = 0.05): 3 sd.
EXACT_TOL, MEAN_TOL = 0.02, 0.15


@pytest.fixture(scope="module")
def models():
    return tiny_models(threads=1)


@pytest.fixture(scope="module")
def natural(models):
    """What the drafter really does on this prompt (in process): greedy output and accept length."""
    target, drafter = models
    ids = encode(PROMPT)
    greedy = Decoder(target, None, 0).generate(ids, N).output_ids
    spec = Decoder(target, drafter, STEPS).generate(ids, N)
    return greedy, len(spec.output_ids) / spec.verify_ct


def serve(tmp_path, accept_len: str, tp: int = 1, token_mode: str = "fixed"):
    env = {"SGLANG_SIMULATE_ACC_LEN": accept_len, "SGLANG_SIMULATE_ACC_TOKEN_MODE": token_mode}
    return embedded_server(tmp_path / f"server{tp}.log", *SPEC, "--tp-size", str(tp), env=env, startup_timeout_s=180)


def accept_len(meta: dict) -> float:
    return meta["completion_tokens"] / meta["spec_verify_ct"]


@pytest.fixture(scope="module")
def forced_2(tmp_path_factory):
    """One tp-1 server forcing accept length 2.0 (token mode fixed) for the two tests that only send it
    requests and read no counter from zero: the single request and its stream, and the 4 requests at once.
    One launch, not two (the batch was test_engine_batching.py's, with a server of its own)."""
    with serve(tmp_path_factory.mktemp("forced_2"), "2.0") as srv:
        yield srv


def test_forced_accept_len_2_overrides_a_drafter_that_accepts_3_8(natural, forced_2):
    greedy, natural_len = natural
    assert natural_len > 3.5  # the drafter alone would accept ~3.8 tokens per verify here
    srv = forced_2
    out = requests.post(srv.base_url + "/generate", json=BODY, timeout=120).json()
    events = requests.post(srv.base_url + "/generate", json={**BODY, "stream": True}, timeout=120).text
    meta = out["meta_info"]
    assert abs(accept_len(meta) - 2.0) <= EXACT_TOL, meta
    assert meta["spec_correct_drafts_histogram"] == [0, meta["spec_verify_ct"], 0, 0]
    assert meta["spec_num_correct_drafts"] == meta["spec_verify_ct"]
    # SGLang's default token mode ("fixed"): every token a forced verify commits is id 100 -- not
    # the target's greedy output (only the prefill's first token is the target's).
    assert out["output_ids"][0] == greedy[0] and set(out["output_ids"][1:]) == {FILL_TOKEN}
    assert out["output_ids"] != greedy
    # Streamed: one event per forced cycle of exactly 2 tokens (a host behind coalesces whole cycles).
    counts = [
        json.loads(b[6:])["meta_info"]["completion_tokens"] for b in events.split("\n\n") if b.startswith("data: {")
    ]
    assert counts[0] % 2 == 1 and counts[-1] == N and all((b - a) % 2 == 0 for a, b in zip(counts, counts[1:-1]))
    assert "forced acceptance: SGLANG_SIMULATE_ACC_LEN=2.0" in srv.log_path.read_text()


def test_forced_acceptance_works_per_request_in_a_batch(forced_2):
    """Forced acceptance with 4 requests at once (the engine's batching): every verify of every request
    commits exactly 2 tokens (one draw per request per verify)."""
    from .test_engine_batching import body, post_all, workload

    work = workload()[4:8]
    outs = post_all(forced_2.base_url, [body(ids, n) for ids, n in work], stagger_s=0.0)
    for out, (_, n) in zip(outs, work):
        meta = out["meta_info"]
        assert meta["spec_correct_drafts_histogram"] == [0, meta["spec_verify_ct"], 0, 0], meta
        # the prefill token is the target's; every verify commits SGLang's "fixed" token id 100
        assert meta["completion_tokens"] == n and set(out["output_ids"][1:]) == {100}


def test_fractional_forcing_draws_floor_or_ceil_seeded_alike_on_every_rank(tmp_path):
    """2.5: each verify commits 2 or 3 tokens, mean 2.5. The draws come from --random-seed: a tp 2
    server (two rank processes drawing on their own) commits exactly what a tp 1 server does -- the
    same counts and, in token mode real-draft-token (the target's bonus tokens, which depend on every
    rank's cache), the same tokens."""
    metas, outs = {}, {}
    for tp in (1, 2):
        with serve(tmp_path, "2.5", tp, token_mode="real-draft-token") as srv:
            out = requests.post(srv.base_url + "/generate", json=BODY, timeout=180).json()
            metas[tp], outs[tp] = out["meta_info"], out["output_ids"]
    assert outs[2] == outs[1] and len(set(outs[1])) > 10  # real text, not token 100
    hist = metas[1]["spec_correct_drafts_histogram"]
    assert hist[0] == hist[3] == 0 and hist[1] > 0 and hist[2] > 0, hist
    assert abs(accept_len(metas[1]) - 2.5) <= MEAN_TOL, metas[1]
    keys = ("spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram", "completion_tokens")
    assert {k: metas[2][k] for k in keys} == {k: metas[1][k] for k in keys}


def test_the_cuda_path_static_runner_forces_like_the_eager_path(models, natural):
    """graphs.StaticRunner.verify (the CUDA path; eager on CPU) takes the forced count: the same
    tokens, cycles and cache lengths as the dynamic path, for both token modes."""
    from spec_decode.engines.embedded.graphs import StaticRunner

    target, drafter = models
    greedy, _ = natural
    ids = encode(PROMPT)
    for mode in ("fixed", "real-draft-token"):
        gens = []
        for runner in (None, StaticRunner(target, drafter, STEPS, use_graphs=False)):
            forced = ForcedAcceptance(2.5, STEPS, token_mode=mode, seed=3)
            gens.append(Decoder(target, drafter, STEPS, runner, forced).generate(ids, 120))
        eager, static = gens
        assert static.output_ids == eager.output_ids and static.histogram == eager.histogram, mode
        assert abs(len(eager.output_ids) / eager.verify_ct - 2.5) <= 0.25
    # real-draft-token: drafts + the target's bonus; forcing every draft in (x = steps + 1) commits the
    # drafter's mistakes too, so the text leaves greedy decoding.
    forced = ForcedAcceptance(STEPS + 1, STEPS, token_mode="real-draft-token", seed=0)
    gen = Decoder(target, drafter, STEPS, None, forced).generate(ids, N)
    assert gen.histogram == [0, 0, 0, gen.verify_ct] and gen.output_ids != greedy
    first_wrong = next(i for i, (a, b) in enumerate(zip(gen.output_ids, greedy)) if a != b)
    assert gen.output_ids[:first_wrong] == greedy[:first_wrong]  # the same text up to a wrong draft


def test_a_forced_job_is_labelled_performance_only_in_record_console_and_mlflow(tmp_path, tmp_store):
    job = tmp_path / "job"
    p = run_py(
        [
            *small("spec.steps=3", "spec.simulate_accept_len=2.0", "benchmark.baseline_arm=false"),
            *tmp_store["overrides"],
            f"hydra.run.dir={job}",
        ]
    )
    label = "performance-only: forced acceptance, outputs are not lossless"
    assert label in p.stderr
    rec = json.loads((job / "results.json").read_text())
    assert rec["status"] == "FINISHED" and any(label in w for w in rec["warnings"])
    assert rec["server_env"]["SGLANG_SIMULATE_ACC_LEN"] == "2.0"  # read back from the live server
    assert rec["server_env"]["SGLANG_SIMULATE_ACC_TOKEN_MODE"] == "fixed"  # a setting, not redacted
    assert abs(rec["metrics"]["accept_len"] - 2.0) <= 0.05
    client = mlflow.tracking.MlflowClient(tmp_store["uri"])
    run = client.get_run(rec["mlflow_run_id"])
    assert run.data.tags["spec_decode.performance_only"] == "true"
    assert run.data.params["spec.simulate_accept_len"] == "2.0"


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["spec.simulate_accept_len=3.5"], "spec.simulate_accept_len=3.5: must be in [1, spec.steps+1] = [1, 3]"),
        (["spec.simulate_accept_len=0.5"], "spec.simulate_accept_len=0.5"),
        (["drafter=none", "spec.simulate_accept_len=2"], "forced acceptance needs speculative decoding"),
        (["+engine.env.SGLANG_SIMULATE_ACC_LEN=2"], "engine.env.SGLANG_SIMULATE_ACC_LEN: set spec.simulate_accept_len"),
    ],
)
def test_bad_forcing_is_refused_before_any_server_starts(tmp_path, tmp_store, overrides, named):
    p = run_py([*overrides, *tmp_store["overrides"], f"hydra.run.dir={tmp_path / 'job'}"], check=False)
    assert p.returncode == 2 and named in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "job" / "server.log").exists()


def test_the_engine_refuses_a_bad_env_value_naming_the_variable(tmp_path):
    for env, named in (
        (("SGLANG_SIMULATE_ACC_LEN", "two"), "SGLANG_SIMULATE_ACC_LEN='two'"),
        (("SGLANG_SIMULATE_ACC_METHOD", "mean"), "SGLANG_SIMULATE_ACC_METHOD='mean'"),
    ):
        extra = {"SGLANG_SIMULATE_ACC_LEN": "2", env[0]: env[1]}
        p = subprocess.run(
            ENGINE + ["--model-path", str(TARGET), *SPEC, "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, **extra},
        )
        assert p.returncode == 2 and named in p.stderr, p.stderr[-1000:]
