"""Every reported experiment in conf/experiment/ runs as a real `-m` sweep (dry run: each job composes,
passes preflight -- missing GPU weights are warnings in a dry run -- and prints its server command)."""

import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ..conftest import ROOT, run_py

pytestmark = pytest.mark.integration
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


# The dry runs take 1 block where an experiment has the block axis: every cell still composes and passes
# preflight once, in an eighth of embedded_steps_nccl's 64 dry jobs (~0.2 s each; the file took 54 s at
# 2 blocks, 43 s at 1, one run each on 2 workers).
BLOCKS = 1


def sweep_points(name: str) -> int:
    """Jobs of the experiment's sweep at BLOCKS blocks: comma lists, and range(a,b) (the block axis)."""
    conf = OmegaConf.load(ROOT / "conf" / "experiment" / f"{name}.yaml")
    bench = OmegaConf.to_container(conf.benchmark) if "benchmark" in conf else {}
    conf.benchmark = {**bench, "blocks": BLOCKS}
    sizes = []
    for v in conf.hydra.sweeper.params.values():
        m = re.fullmatch(r"range\((\d+),(\d+)\)", str(v))
        sizes.append(int(m[2]) - int(m[1]) if m else len(str(v).split(",")))
    return math.prod(sizes)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_as_a_dry_run_sweep(name, tmp_path: Path):
    args = ["-m", f"experiment={name}", "dry_run=true", "tracking=off", f"benchmark.blocks={BLOCKS}"]
    p = run_py([*args, f"hydra.sweep.dir={tmp_path}"])
    out = p.stdout
    assert out.count("# server command:") == sweep_points(name), out[-3000:]
    assert "# error (would stop this job)" not in out, out[-3000:]
    assert out.count("# job: ") == sweep_points(name)
    assert not list(tmp_path.rglob("server.log"))  # nothing launched
    assert "report: none (no job wrote results.json)" in p.stderr  # no report command that would fail
    assert "0 job(s)" not in p.stderr and "no A/A control" not in p.stderr  # no empty table, no alarms
    assert "python -m spec_decode.views.report" not in p.stderr
