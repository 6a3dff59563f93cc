"""The GPU box's install resolves: `pip install -e '.[sglang]'` with pip's real resolver against the
package index (dry run: nothing is installed). sglang 0.5.23 pins torch==2.14.1 and
transformers==5.19.0, so a pin of either in our core dependencies makes this fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.contract


@pytest.mark.skipif(
    os.environ.get("SPEC_DECODE_SKIP_CONTRACT") == "1",
    reason="SPEC_DECODE_SKIP_CONTRACT=1 (offline machine): the index is not reachable",
)
def test_sglang_extra_resolves(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "-e",
            f"{ROOT}[sglang]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"`pip install -e '.[sglang]'` does not resolve:\n{proc.stderr[-3000:]}"
    chosen = {
        i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    # What sglang itself pins wins; our core stack comes along.
    assert chosen["sglang"] == "0.5.23"
    assert chosen["torch"] == "2.14.1"
    assert chosen["transformers"] == "5.19.0"
    for name in ("mlflow", "dvc", "hydra-core"):
        assert name in chosen, f"{name} missing from the resolved set"
