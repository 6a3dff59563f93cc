"""Issue 29 (i): the MLflow UI (3.17.2) opens where the sweep's last lines say -- the runs table, not the
GenAI overview -- with the sweep unfolded and the key columns; the parent run shows the sweep's
headline metrics and params. Issue 44: the experiment clicked in the UI's experiments list lands on the
runs table too. Real sweep (the shared headline sweep, tests/integration/conftest.py), the `mlflow ui`
command the sweep printed (`--app-name spec-decode`) on a free loopback port, headless Chromium (Debian's
`chromium`; .ci/run installs it), each page from a fresh browser profile (a first visit).
SPEC_DECODE_UI_SHOTS=docs/img saves the screenshots."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from spec_decode.engines.server_process import free_port

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, profile: Path, *, shot: Path | None = None) -> str:
    """The page's DOM after it settled (and a screenshot), from a fresh browser profile (a first visit)."""
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=25000",
        "--window-size=1600,1000",
    ]
    if shot is not None:
        subprocess.run([*args, f"--screenshot={shot}", url], capture_output=True, timeout=180, check=True)
    return subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout


@pytest.fixture(scope="module")
def ui(headline_sweep):
    """`mlflow ui` on the shared sweep's store (tests/integration/conftest.py: spec.steps=1,3 x nccl), as
    the sweep's last lines name it (`open: mlflow ui --backend-store-uri … --app-name spec-decode  ->  …`).
    One server for the module's two tests (each page still from a fresh browser profile; what a page can
    change is in the store, which both tests share anyway): one `mlflow ui` start-up, not two."""
    printed = re.search(r"open: (mlflow ui .+?)  ->", headline_sweep.proc.stderr).group(1)
    argv = shlex.split(printed)
    assert argv[argv.index("--backend-store-uri") + 1] == headline_sweep.uri and "--app-name" in argv, printed
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            *argv,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "mlflow ui exited"
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "mlflow ui did not answer"
            time.sleep(0.5)
        yield headline_sweep.proc.stderr, f"http://127.0.0.1:{port}", headline_sweep.uri
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install chromium; .ci/run does)")
def test_the_printed_link_opens_the_runs_table_unfolded_with_the_key_columns(ui, tmp_path):
    out, base, uri = ui
    link = re.search(r"->\s+http://127\.0\.0\.1:5000(/#/experiments/\S+)", out).group(1)  # as the sweep printed it
    # the screenshots only when asked for (nothing reads them here): each is one more Chromium launch
    shots = Path(os.environ["SPEC_DECODE_UI_SHOTS"]) if os.environ.get("SPEC_DECODE_UI_SHOTS") else None
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    dom = chromium(base + link, tmp_path / "p1", shot=shots and shots / "mlflow_saved_view.png")
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("spec_decode.role") == "sweep")
    children = [r.info.run_name for r in runs if r is not parent]
    assert 'role="grid"' in dom and "Detect Issues" not in dom
    assert parent.info.run_name in dom
    assert children and all(f">{name}<" in dom for name in children), children  # unfolded
    for col in (
        "spec.steps",
        "nccl",
        "throughput_tok_s",
        "speedup_vs_baseline",
    ):  # the first ones (the grid draws what fits)
        assert f">{col}<" in dom, col
    exp_page = link.split("&viewStateShareKey")[0]  # the experiment page itself
    dom = chromium(base + exp_page, tmp_path / "p2", shot=shots and shots / "mlflow_experiment.png")
    assert 'role="grid"' in dom and "Detect Issues" not in dom and all(f">{n}<" in dom for n in children)
    # the parent run: the sweep's headline numbers and axes, and its description as rendered markdown
    assert {"best_speedup_vs_baseline", "best_throughput_tok_s", "baseline_throughput_tok_s"} <= set(
        parent.data.metrics
    )
    assert parent.data.params["sweep.spec.steps"] == "1,3"
    dom = chromium(
        f"{base}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning",
        tmp_path / "p3",
        shot=shots and shots / "mlflow_parent_run.png",
    )
    assert "best_speedup_vs_baseline" in dom and "sweep.spec.steps" in dom
    assert "<table" in dom  # the description's sweep table, rendered


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install chromium; .ci/run does)")
def test_a_click_on_the_experiment_in_the_list_lands_on_the_runs_table(ui, tmp_path):
    """What a click on the experiment's name in the experiments list opens (`#/experiments/<id>`: no
    workflowType), in a browser that never chose GenAI or "Model training". MLflow 3.17.2 alone lands it on
    the GenAI Overview (0 traces, a "Detect Issues" popup) whatever the experiment's tags say; the server
    the sweep names (`--app-name spec-decode`, spec_decode/views/mlflow_app.py) opens the runs table."""
    _, base, uri = ui
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench").experiment_id
    assert f'href="#/experiments/{exp}"' in chromium(base + "/#/experiments", tmp_path / "p0")  # the list's link
    dom = chromium(f"{base}/#/experiments/{exp}", tmp_path / "p1")
    names = [r.info.run_name for r in c.search_runs([exp])]
    assert 'role="grid"' in dom and all(f">{n}<" in dom for n in names), names  # the runs, unfolded
    assert "Detect Issues" not in dom and ">Overview<" not in dom
    shots = Path(os.environ.get("SPEC_DECODE_UI_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    chromium(f"{base}/#/experiments/{exp}", tmp_path / "p2", shot=shots / "mlflow_experiment_clicked.png")
    assert (shots / "mlflow_experiment_clicked.png").stat().st_size > 20_000
