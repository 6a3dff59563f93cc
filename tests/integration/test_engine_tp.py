"""Tensor parallelism in the embedded engine, with real rank processes over real gloo.

- the math: tp=2 logits equal tp=1 bit for bit; greedy output at tp=2 equals tp=1 (baseline and
  steps 1, 2, 3, 5, several prompts); the tp>2 reduction path equals the one-process sum;
- a real `--tp-size 2` server: lossless over HTTP, rank pids and environment, one logging rank,
  one profile file per rank;
- lifecycle: a rank killed (idle or mid-request) fails the server within seconds and leaves no
  process; the front killed takes its ranks along; a SIGSTOPped rank does not survive kill_tree;
- a bad --tp-size exits 2 naming the flag and the head counts.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import threading
import time
import uuid

import psutil
import pytest
import requests
import torch

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_drafter, load_target, read_config
from spec_decode.engines.embedded.parallel import TensorParallel, shard_units, tree_sum
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.engines.server_process import ServerProcess, free_port, kill_tree
from spec_decode.parsers.profile import read_ranks

from ..conftest import DRAFTER, PROMPTS, TARGET
from .engine_args import ENGINE, spec_flags

pytestmark = pytest.mark.integration
STEPS = (1, 2, 3, 5)
TOKENS = 60  # enough for several cycles at every step count, small for 2 cores
CFG = read_config(TARGET)
UNITS = shard_units(CFG["num_attention_heads"], CFG["num_key_value_heads"], CFG["intermediate_size"])


def prompts(n: int = 3) -> list[list[int]]:
    return [encode(json.loads(line)["text"]) for line in PROMPTS.read_text().splitlines()[:n]]


@pytest.fixture(scope="module")
def reference():
    """tp=1 in this process, 1 thread (as every rank runs): {steps: [output ids per prompt]}, and the
    prefill logits of the first prompt."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load_target(TARGET)
        drafter = load_drafter(DRAFTER, target)
        out = {0: [Decoder(target, None, 0).generate(p, TOKENS).output_ids for p in prompts()]}
        for k in STEPS:
            out[k] = [Decoder(target, drafter, k).generate(p, TOKENS).output_ids for p in prompts()]
        with torch.inference_mode():
            logits, aux = target(torch.tensor([prompts()[0]]), target.new_cache(), [1, 3, 4])
    finally:
        torch.set_num_threads(threads)
    return out, logits, aux


# --------------------------------------------------------------------------- the math, in ranks


def _join(rank: int, size: int, port: int) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)


def _decode_in_rank(rank: int, size: int, port: int, queue) -> None:
    _join(rank, size, port)
    tp = TensorParallel(size=size, rank=rank, units=UNITS)
    target = load_target(TARGET, "cpu", tp)
    drafter = load_drafter(DRAFTER, target)
    out = {0: [Decoder(target, None, 0).generate(p, TOKENS).output_ids for p in prompts()]}
    for k in STEPS:
        out[k] = [Decoder(target, drafter, k).generate(p, TOKENS).output_ids for p in prompts()]
    with torch.inference_mode():
        logits, aux = target(torch.tensor([prompts()[0]]), target.new_cache(), [1, 3, 4])
    # Plain pickle: a tensor through an mp.Queue travels as a shared-memory fd, which breaks when
    # this process exits before the parent reads it.
    queue.put((rank, out, pickle.dumps(logits), pickle.dumps(aux)))
    torch.distributed.destroy_process_group()


def _reduce_in_rank(rank: int, size: int, port: int, queue) -> None:
    _join(rank, size, port)
    units = 8
    full = torch.randn(units, 5, 16, generator=torch.Generator().manual_seed(7))
    tp = TensorParallel(size=size, rank=rank, units=units)
    lo, hi = tp.local_units
    queue.put((rank, pickle.dumps(tp.reduce(full[lo:hi].clone()))))
    torch.distributed.destroy_process_group()


def run_ranks(fn, size: int, timeout_s: float = 240) -> list:
    """Run fn(rank, size, port, queue) in `size` spawned processes; their results by rank."""
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=fn, args=(r, size, port, queue)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in range(size):
            item = queue.get(timeout=timeout_s)
            results[item[0]] = item[1:]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0, f"rank process exited {p.exitcode}"
        return [results[r] for r in range(size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


@pytest.mark.skipif(UNITS % 2, reason="the target cannot be split in 2")
def test_tp2_decodes_exactly_like_tp1(reference):
    """Logits and aux features bit-equal to tp=1 on every rank; greedy output token for token equal
    for the baseline and every step count on several prompts (and so equal to plain greedy)."""
    want, want_logits, want_aux = reference
    for rank, (out, logits, aux) in enumerate(run_ranks(_decode_in_rank, 2)):
        logits, aux = pickle.loads(logits), pickle.loads(aux)
        assert torch.equal(logits, want_logits), f"rank {rank}: logits differ from tp=1"
        assert torch.equal(aux, want_aux), f"rank {rank}: captured features differ from tp=1"
        for k, outs in out.items():
            assert outs == want[k], f"rank {rank}: steps={k} differs from tp=1"
            assert outs == want[0], f"rank {rank}: steps={k} differs from greedy"


def test_reduction_beyond_two_ranks_equals_one_process():
    """tp 4 (slots + zero all-reduce) and tp 2 (halves + one all-reduce) both reproduce the tp-1 tree
    sum bit for bit, on every rank."""
    full = torch.randn(8, 5, 16, generator=torch.Generator().manual_seed(7))
    want = tree_sum(full)
    for size in (2, 4):
        for rank, (got,) in enumerate(run_ranks(_reduce_in_rank, size)):
            assert torch.equal(pickle.loads(got), want), f"tp={size} rank {rank}"


# --------------------------------------------------------------------------- a real tp=2 server


def marker_env(tmp_path) -> dict:
    return {
        "SPEC_DECODE_TEST_MARKER": uuid.uuid4().hex,
        "NCCL_ALGO": "Ring",
        "SPEC_DECODE_PROFILE": str(tmp_path / "profile.jsonl"),
    }


def ours(marker: str) -> list[psutil.Process]:
    """Live processes carrying our marker in their environment (the front and every rank)."""
    found = []
    for p in psutil.process_iter():
        try:
            if (
                p.pid != os.getpid()
                and p.environ().get("SPEC_DECODE_TEST_MARKER") == marker
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def start_server(tmp_path, steps: int | None = 3, tp: int = 2, extra: list[str] = ()) -> ServerProcess:
    port = free_port()
    argv = ENGINE + [
        "--model-path",
        str(TARGET),
        "--port",
        str(port),
        "--tp-size",
        str(tp),
        "--decode-log-interval",
        "5",
        *(spec_flags(steps) if steps else []),
        *extra,
    ]
    env = marker_env(tmp_path)
    srv = ServerProcess(
        argv, env=env, log_path=tmp_path / "server.log", host="127.0.0.1", port=port, startup_timeout_s=120
    )
    srv.marker = env["SPEC_DECODE_TEST_MARKER"]
    return srv.start()


def body(ids: list[int], n: int = TOKENS) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


@pytest.mark.skipif(UNITS % 2, reason="the target cannot be split in 2")
def test_tp2_server_is_lossless_with_one_logging_rank_and_a_profile_per_rank(tmp_path, reference):
    want = reference[0]
    srv = start_server(tmp_path)
    try:
        info = requests.get(srv.base_url + "/server_info", timeout=10).json()
        assert info["tp_size"] == 2 and len(info["rank_pids"]) == 2
        front = psutil.Process(srv.pid)
        assert {c.pid for c in front.children()} >= set(info["rank_pids"])
        for pid in info["rank_pids"]:  # each rank has the server's environment, not only the front
            assert psutil.Process(pid).environ().get("NCCL_ALGO") == "Ring"
        t0, verify_ct, n = time.time(), 0, 0
        for ids, expected in zip(prompts(), want[3]):
            r = requests.post(srv.base_url + "/generate", json=body(ids), timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["output_ids"] == expected
            verify_ct += r.json()["meta_info"]["spec_verify_ct"]
            n += 1
    finally:
        srv.stop()  # kill_tree: SIGTERM to every process; the plugin drains each rank's tail
    log = (tmp_path / "server.log").read_text()
    decode_lines = [line for line in log.splitlines() if "Decode batch" in line]
    assert decode_lines and all(" TP0] Decode batch" in line for line in decode_lines)
    ranks = read_ranks(tmp_path / "profile.jsonl")
    assert sorted(ranks) == [0, 1], f"profile files: {sorted(ranks)}"
    timed = {rank: [c for c in cycles if c["t"] >= t0] for rank, cycles in ranks.items()}
    # every counted verify, plus at most one uncounted in-flight cycle per request (overlap scheduler)
    assert verify_ct <= len(timed[0]) <= verify_ct + n, f"{len(timed[0])} cycles, {verify_ct} verifies"
    assert len(timed[1]) == len(timed[0])  # the ranks run the same cycles, in lockstep
    assert [c["accepted"] for c in timed[1]] == [c["accepted"] for c in timed[0]]
    for rank, cycles in ranks.items():
        assert all(c["rank"] == rank for c in cycles)


def wait_exit(srv: ServerProcess, within_s: float) -> tuple[int | None, float]:
    t0 = time.monotonic()
    try:
        code = srv.proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - t0


def wait_gone(marker: str, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while (left := ours(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_killed_rank_fails_the_server_fast_with_its_last_lines(tmp_path):
    srv = start_server(tmp_path, steps=None)
    try:
        rank1 = requests.get(srv.base_url + "/server_info", timeout=10).json()["rank_pids"][1]
        os.kill(rank1, signal.SIGKILL)
        code, took = wait_exit(srv, 5)
        assert code not in (None, 0), f"server exit code {code}"
        assert took < 2.5, f"server took {took:.1f}s to exit"
        log = (tmp_path / "server.log").read_text()
        assert f"rank 1 (pid {rank1}) died (signal SIGKILL)" in log
        assert "TP1] rank 1 (pid" in log.split("died (signal SIGKILL)")[1]  # its last lines, quoted
        assert not wait_gone(srv.marker, 3)
    finally:
        srv.stop()


def test_a_rank_killed_mid_request_answers_5xx_not_a_hang(tmp_path):
    srv = start_server(tmp_path, steps=None)
    try:
        pids = requests.get(srv.base_url + "/server_info", timeout=10).json()["rank_pids"]
        answer: dict = {}

        def long_request():
            try:
                r = requests.post(srv.base_url + "/generate", json=body(prompts(1)[0], 900), timeout=30)
                answer["status"] = r.status_code
                answer["message"] = r.json()["error"]["message"]
            except requests.RequestException as e:
                answer["error"] = repr(e)

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)  # 900 tokens at tp=2 on this machine take several seconds
        os.kill(pids[0], signal.SIGKILL)
        t.join(timeout=10)
        assert not t.is_alive(), "the in-flight request hung"
        assert answer.get("status") == 503, answer
        assert "rank 0" in answer["message"] and "died" in answer["message"]
        code, _ = wait_exit(srv, 5)
        assert code not in (None, 0)
        assert not wait_gone(srv.marker, 3)
    finally:
        srv.stop()


def test_killing_the_front_takes_the_ranks_along(tmp_path):
    srv = start_server(tmp_path, steps=None)
    try:
        os.kill(srv.pid, signal.SIGKILL)
        srv.proc.wait(timeout=5)
        left = wait_gone(srv.marker, 4)
        assert not left, f"ranks outlived the front: {[p.pid for p in left]}"
    finally:
        srv.stop()


def test_a_stopped_rank_does_not_survive_kill_tree(tmp_path):
    srv = start_server(tmp_path, steps=None)
    try:
        pids = requests.get(srv.base_url + "/server_info", timeout=10).json()["rank_pids"]
        os.kill(pids[1], signal.SIGSTOP)
        kill_tree(srv.pid)
        assert not wait_gone(srv.marker, 2)
    finally:
        srv.stop()


def bad_tp_sizes() -> list[int]:
    heads = CFG["num_attention_heads"]
    non_divisor = next(d for d in range(2, heads + 2) if heads % d)
    return [0, -2, non_divisor, UNITS * 2]


@pytest.mark.parametrize("tp", bad_tp_sizes())
def test_bad_tp_size_exits_2_naming_the_flag_and_heads(tp):
    p = subprocess.run(
        ENGINE + ["--model-path", str(TARGET), "--tp-size", str(tp)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stderr
    assert f"--tp-size {tp}" in p.stderr
    assert f"num_attention_heads ({CFG['num_attention_heads']})" in p.stderr


def test_tree_sum_adds_in_the_documented_order():
    """tree_sum's order is the tp invariant: two halves summed pairwise, then added (8 units: one
    pairwise pass over all 8, fewer kernels, the same additions). Checked against the written-out
    order on values whose sum depends on the order."""
    g = torch.Generator().manual_seed(0)
    for n in (2, 4, 6, 8):
        p = torch.randn(n, 3, 64, generator=g) * torch.logspace(-4, 4, n)[:, None, None]
        if n == 8:
            want = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
        elif n == 6:
            want = ((p[0] + p[1]) + p[2]) + ((p[3] + p[4]) + p[5])
        elif n == 4:
            want = (p[0] + p[1]) + (p[2] + p[3])
        else:
            want = p[0] + p[1]
        assert torch.equal(tree_sum(p), want), n
