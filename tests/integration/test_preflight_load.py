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
    p = run_py(
        [
            "benchmark.concurrency=8",
            "engine.max_running_requests=4",
            "tracking=off",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        check=False,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "benchmark.concurrency=8 is above engine.max_running_requests=4" in p.stderr
    assert "raise engine.max_running_requests to >= 8" in p.stderr
    assert not list(tmp_path.glob("job/**/server.log")), "a server was started"
    assert errors("benchmark.concurrency=4", "engine.max_running_requests=4") == []  # what fits passes


def warnings(*overrides: str) -> list[str]:
    return preflight.check(compose_experiment(*overrides), ROOT).warnings


def test_embedded_on_cuda_batches_on_its_graph_buckets_and_warns_above_them():
    """The embedded engine's static (CUDA-graph) path holds --max-running-requests requests in graph
    buckets up to engine.cuda_graph_max_bs_decode (issue 26): concurrency 16 passes on CUDA; above the
    graph cap the batches run eagerly, which preflight says (a warning naming the key), not refuses."""
    ok = preflight.check(compose_experiment("hardware=h200x1", "benchmark.concurrency=16"), ROOT)
    assert not any("concurrency" in e for e in ok.errors + ok.warnings), (ok.errors, ok.warnings)
    over = warnings("hardware=h200x1", "benchmark.concurrency=16", "engine.cuda_graph_max_bs_decode=8")
    assert any(w.startswith("benchmark.concurrency=16 is above engine.cuda_graph_max_bs_decode=8") for w in over), over
    assert not any(
        "concurrency" in e
        for e in errors("hardware=h200x1", "benchmark.concurrency=16", "engine.cuda_graph_max_bs_decode=8")
    )
    eager = warnings(
        "hardware=h200x1",
        "benchmark.concurrency=16",
        "engine.cuda_eager_batching=true",
        "engine.cuda_graph_max_bs_decode=8",
    )
    assert not any("concurrency" in w for w in eager), eager  # no graphs on that path: nothing to warn about
    from spec_decode.engines import server_command

    argv = server_command(compose_experiment("hardware=h200x1", "engine.cuda_eager_batching=true"), 1)
    assert "--cuda-eager-batching" in argv
    assert "--cuda-eager-batching" not in server_command(compose_experiment("engine.cuda_eager_batching=true"), 1)
    argv = server_command(compose_experiment("hardware=h200x1", "engine.cuda_graph_max_bs_decode=8"), 1)
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "8"
    assert "--cuda-graph-max-bs-decode" not in server_command(compose_experiment("hardware=h200x1"), 1)


@pytest.mark.parametrize(
    "overrides,named",
    [
        ([], "engine.cuda_graph_max_bs_decode=4"),  # conf/engine/sglang.yaml's 4
        (["engine.cuda_graph_max_bs_decode=64"], "engine.max_running_requests (null: SGLang's 48 with speculation)=48"),
        (["engine.cuda_graph_max_bs_decode=64", "engine.max_running_requests=16"], "engine.max_running_requests=16"),
    ],
)
def test_sglang_concurrency_above_what_the_server_holds_is_refused(overrides, named):
    errs = errors("engine=sglang", "hardware=h200x2", "benchmark.concurrency=50", *overrides)
    assert any(e.startswith("benchmark.concurrency=50 is above " + named) for e in errs), errs


def test_sglang_argv_carries_the_running_cap():
    from spec_decode.engines import server_command

    argv = server_command(
        compose_experiment(
            "engine=sglang",
            "hardware=h200x1",
            "engine.max_running_requests=32",
            "engine.cuda_graph_max_bs_decode=32",
            "benchmark.concurrency=32",
        ),
        30000,
    )
    assert argv[argv.index("--max-running-requests") + 1] == "32"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert "--max-running-requests" not in server_command(compose_experiment("engine=sglang", "hardware=h200x1"), 1)
