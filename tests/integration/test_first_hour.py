"""Issue 29 (g): an experiment that defines a sweep, run without -m, is refused (not one silent job at
the defaults); a streamed job prints TTFT/ITL/TPOT P50/P90/P99 with the sample count; the README's GPU
section states sglang 0.5.23's CUDA 13 requirement and its Kimi dry run (run as written) carries
--trust-remote-code."""

import re
import shlex

import pytest

from ..conftest import ROOT, run_py

pytestmark = pytest.mark.integration


def test_experiment_with_a_sweep_without_m_is_refused(tmp_path):
    p = run_py(["experiment=ci_smoke", "tracking=off", f"hydra.run.dir={tmp_path}"], check=False)
    assert p.returncode == 2, p.stderr
    assert "error: experiment=ci_smoke defines a sweep (spec.steps=1,3 nccl=default)" in p.stderr
    assert "python run.py -m experiment=ci_smoke" in p.stderr
    assert not (tmp_path / "results.json").exists() and "Traceback" not in p.stderr
    assert "defines a sweep" in (tmp_path / "run.log").read_text()  # the job dir says why it is empty


def test_a_refused_job_says_why_in_its_run_log(tmp_path):
    p = run_py(["benchmark.runs=0", "tracking=off", f"hydra.run.dir={tmp_path}"], check=False)
    assert p.returncode == 2 and "error: benchmark.runs=0: must be >= 1" in p.stderr, p.stderr
    assert (tmp_path / "run.log").read_text() == "error: benchmark.runs=0: must be >= 1\n"


def test_streamed_job_prints_latency_percentiles_with_counts(streamed_job):
    # the shared streamed job (tests/integration/conftest.py): what run.py printed
    p = streamed_job.proc
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout + p.stderr
    for name, n in (("TTFT", r"n=2; P99 of 2 samples is near the maximum"), ("ITL ", r"n=\d+"), ("TPOT", r"n=2")):
        assert re.search(rf"  {name} P50 [\d.]+  P90 [\d.]+  P99 [\d.]+ ms  \({n}", out), out[-2000:]


def test_readme_gpu_section_states_cuda_13_and_its_kimi_dry_run_works(tmp_path):
    text = (ROOT / "README.md").read_text()
    gpu = text[text.index("## Running on a GPU box with SGLang") : text.index("## Phase profiler")]
    assert "CUDA 13" in gpu and "flashinfer_python[cu13]==0.7.2" in gpu and "R580" in gpu
    block = re.search(r"```bash\n(python run.py engine=sglang[^`]*dry_run=true)\n```", gpu).group(1)
    args = shlex.split(block.replace("\\\n", " "))[2:]
    p = run_py([*args, "tracking=off", f"hydra.run.dir={tmp_path}"])
    assert "--trust-remote-code" in p.stdout + p.stderr and "--tp-size 8" in p.stdout + p.stderr
