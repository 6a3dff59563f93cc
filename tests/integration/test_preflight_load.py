"""A concurrency the server cannot hold is refused in preflight, naming the key (issue 28), before any
server starts: the embedded engine's running batch and graph buckets, SGLang's --max-running-requests
(48 when unset with speculation) and --cuda-graph-max-bs-decode."""

import pytest

from spec_decode.runner import preflight

from ..conftest import ROOT, compose_experiment, run_py

pytestmark = pytest.mark.integration


def errors(*overrides: str) -> list[str]:
    return preflight.check(compose_experiment(*overrides), ROOT).errors


def test_embedded_concurrency_above_max_running_requests_is_refused_before_a_server_starts(tmp_path):
    p = run_py(["benchmark.concurrency=8", "engine.max_running_requests=4", "tracking=off",
                f"hydra.run.dir={tmp_path / 'job'}"], check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "benchmark.concurrency=8 is above engine.max_running_requests=4" in p.stderr
    assert "raise engine.max_running_requests to >= 8" in p.stderr
    assert not list(tmp_path.glob("job/**/server.log")), "a server was started"
    assert errors("benchmark.concurrency=4", "engine.max_running_requests=4") == []  # what fits passes


def test_embedded_cuda_graph_buckets_bound_the_concurrency():
    over = errors("hardware=h200x1", "benchmark.concurrency=32", "engine.max_running_requests=32")
    assert any("engine.cuda_graph_max_bs_decode=16" in e and "raise engine.cuda_graph_max_bs_decode to >= 32" in e
               for e in over), over
    ok = errors("hardware=h200x1", "benchmark.concurrency=32", "engine.max_running_requests=32",
                "engine.cuda_graph_max_bs_decode=32")
    assert not any("concurrency" in e for e in ok), ok
    eager = errors("hardware=h200x1", "benchmark.concurrency=32", "engine.max_running_requests=32",
                   "engine.extra_args=[--disable-cuda-graph]")  # eager on purpose: no graph bound
    assert not any("concurrency" in e for e in eager), eager


@pytest.mark.parametrize("overrides,named", [
    ([], "engine.cuda_graph_max_bs_decode=4"),  # conf/engine/sglang.yaml's 4
    (["engine.cuda_graph_max_bs_decode=64"], "engine.max_running_requests (null: SGLang's 48 with speculation)=48"),
    (["engine.cuda_graph_max_bs_decode=64", "engine.max_running_requests=16"], "engine.max_running_requests=16"),
])
def test_sglang_concurrency_above_what_the_server_holds_is_refused(overrides, named):
    errs = errors("engine=sglang", "hardware=h200x2", "benchmark.concurrency=50", *overrides)
    assert any(e.startswith("benchmark.concurrency=50 is above " + named) for e in errs), errs


def test_sglang_argv_carries_the_running_cap():
    from spec_decode.engines import server_command

    argv = server_command(compose_experiment("engine=sglang", "hardware=h200x1", "engine.max_running_requests=32",
                                             "engine.cuda_graph_max_bs_decode=32", "benchmark.concurrency=32"), 30000)
    assert argv[argv.index("--max-running-requests") + 1] == "32"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert "--max-running-requests" not in server_command(compose_experiment("engine=sglang", "hardware=h200x1"), 1)
