"""Shared fixtures: real Hydra composition, real engine processes, real MLflow stores in tmp dirs."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "tiny" / "target"
DRAFTER = ROOT / "models" / "tiny" / "drafter"
PROMPTS = ROOT / "data" / "prompts.jsonl"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# OpenMP threads that wait by sleeping, not spinning: inherited by every process a test starts (run.py,
# servers, builds, dvc). Results are bit-identical (only the wait changes), but on a shared 2-core box a
# 2-thread torch process that spins loses its core to its own idle thread: a 40-step drafter training
# took 221 s wall (100 s CPU) spinning and 35 s (11 s CPU) passive, at load 6 (docs/testing.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# The CPU slot of every job a test starts comes from this test run's own pool (hardware.slots_dir), not
# the machine-wide /tmp/spec_decode_slots: on a shared box a test's job otherwise waits, slot-less, for
# whatever sweep someone else is running (a 3 s job waited 163 s, docs/testing.md). The allocator itself
# is tested in test_scale_out.py with its own dir; concurrent jobs of one test still share one pool.
SLOTS_DIR = Path(tempfile.mkdtemp(prefix="spec_decode_test_slots_"))
atexit.register(shutil.rmtree, SLOTS_DIR, True)
# ... also for the jobs that a stage command starts (dvc repro in test_dvc): hardware.slots_dir's default
# reads SPEC_DECODE_SLOTS_DIR
os.environ["SPEC_DECODE_SLOTS_DIR"] = str(SLOTS_DIR)


def own_slots(args: list[str]) -> list[str]:
    """run.py ARGS with this test run's slot pool, unless they name one."""
    if any(a.startswith("hardware.slots_dir=") for a in args):
        return list(args)
    return [*args, f"hardware.slots_dir={SLOTS_DIR}"]


def run_py(
    args: list[str], *, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
    """python run.py ARGS in a subprocess (real Hydra, real launcher), taking slots from SLOTS_DIR."""
    full_env = {**os.environ, **(env or {})}
    args = own_slots(args)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"run.py {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


# An empty MLflow sqlite store, its tables made and its migrations run, once per test process: MLflow
# takes ~1.5 s of CPU to create a store and ~0.6 s to open one (measured 2026-12-01), and some 40 tests
# each start with a new one. `tmp_store` hands each test a copy; `fresh_store` none.
_EMPTY_STORE = Path(tempfile.mkdtemp(prefix="spec_decode_test_store_")) / "mlflow.db"
atexit.register(shutil.rmtree, _EMPTY_STORE.parent, True)


def store_at(d: Path, *, copy_empty: bool = True) -> dict:
    """An MLflow sqlite store + artifact dir in ``d``, as Hydra overrides and as a client URI. With
    ``copy_empty`` the db file is a copy of an empty store made once per test process (the same file
    run.py would create, minus the wait); without, no file exists yet."""
    db = d / "mlflow.db"
    if copy_empty:
        if not _EMPTY_STORE.exists():
            from mlflow.tracking import MlflowClient  # lazy: mlflow costs ~1 s of start-up; unit tests never pay it

            MlflowClient(f"sqlite:///{_EMPTY_STORE}").search_experiments()
        shutil.copyfile(_EMPTY_STORE, db)
    return {
        "uri": f"sqlite:///{db}",
        "overrides": [f"tracking.uri=sqlite:///{db}", f"tracking.artifact_location={d / 'mlartifacts'}"],
    }


@pytest.fixture
def tmp_store(tmp_path: Path) -> dict:
    """``store_at(tmp_path)``: a copy of the empty store."""
    return store_at(tmp_path)


@pytest.fixture
def fresh_store(tmp_path: Path) -> dict:
    """``tmp_store`` with no file yet: for the tests about the store's creation (a Ctrl-C while it is
    made, two sweeps creating one at once, a dry run that must create none)."""
    return store_at(tmp_path, copy_empty=False)


def small(*extra: str) -> list[str]:
    """Overrides that keep an embedded job to a second or two."""
    return ["benchmark.max_new_tokens=48", "benchmark.runs=2", "benchmark.warmup=1", *extra]


def compose_experiment(*overrides: str):
    """The typed ExperimentConfig that real Hydra composition gives for these overrides (conf/)."""
    from hydra import compose, initialize_config_dir

    from spec_decode.core.config import register_configs, to_experiment

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_experiment(compose("config", overrides=list(overrides)))


# Tests that compare speeds inside one run (the A/A control's twins) assume the machine's load does not
# change between their arms; with two xdist workers the other worker's tests would change it. A test
# marked `quiet` runs with no other test beside it: it takes the run's quiet lock and then every worker's
# busy lock (each worker holds its own across a test's setup, call and teardown); other tests wait at the
# quiet lock before they start.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:  # one process: nothing runs beside it
        yield
        return
    from contextlib import ExitStack  # lazy: only under xdist

    from filelock import FileLock

    locks = Path(tempfile.gettempdir()) / f"spec_decode_test_locks_{os.environ['PYTEST_XDIST_TESTRUNUID']}"
    locks.mkdir(exist_ok=True)
    quiet = FileLock(str(locks / "quiet.lock"))
    with ExitStack() as held:
        if item.get_closest_marker("quiet"):
            held.enter_context(quiet)
            for i in range(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))):
                held.enter_context(FileLock(str(locks / f"busy-gw{i}.lock")))
        else:
            with quiet:  # a quiet test is running: wait for it
                pass
            held.enter_context(FileLock(str(locks / f"busy-{worker}.lock")))
        yield
