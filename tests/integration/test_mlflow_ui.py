"""Issue 29 (i): the MLflow UI (3.17.2) opens where the sweep's last lines say -- the runs table, not the
GenAI overview -- with the sweep unfolded and the key columns; the parent run shows the sweep's
headline metrics and params. Real sweep (the shared headline sweep, tests/integration/conftest.py), real
`mlflow ui` on a free loopback port, headless Chromium (Debian's `chromium`; .ci/run installs it).
SPEC_DECODE_UI_SHOTS=docs/img saves the screenshots."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from spec_decode.runner.server import free_port

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


@pytest.fixture
def ui(headline_sweep):
    """`mlflow ui` on the shared sweep's store (tests/integration/conftest.py: spec.steps=1,3 x nccl)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            headline_sweep.uri,
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
