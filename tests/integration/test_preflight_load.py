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


def test_embedded_on_cuda_holds_one_request_unless_eager_batching():
    """The embedded engine's static (CUDA-graph) path holds one request (graph buckets per batch size are
    not built): concurrency 4 is refused there, naming the switch that batches (the eager path)."""
    over = errors("hardware=h200x1", "benchmark.concurrency=4")
    assert any(e.startswith("benchmark.concurrency=4: engine=embedded on CUDA decodes on its static (CUDA-graph) "
                            "path, which holds 1 request") and "engine.cuda_eager_batching=true" in e for e in over), over
    assert not any("concurrency" in e for e in errors("hardware=h200x1", "benchmark.concurrency=1", "benchmark.load=true"))
    eager = errors("hardware=h200x1", "benchmark.concurrency=16", "engine.cuda_eager_batching=true")
    assert not any("concurrency" in e for e in eager), eager
    from spec_decode.engines import server_command

    argv = server_command(compose_experiment("hardware=h200x1", "engine.cuda_eager_batching=true"), 1)
    assert "--cuda-eager-batching" in argv
    assert "--cuda-eager-batching" not in server_command(compose_experiment("engine.cuda_eager_batching=true"), 1)


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
