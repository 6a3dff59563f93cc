"""The facts of a record's ``provenance`` section, collected by the runner when a job starts: git state,
packages, machine, GPU/NCCL facts, the host fingerprint (``runner.machine``), the hashes of the job's inputs
(DVC md5s, else sha256). What explains a number; the record (``record.results``) stores it as collected.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from spec_decode.record.provenance import Provenance
from spec_decode.runner.machine import fingerprint

# libyaml's parser where PyYAML has it: dvc.lock is read for every job, and the pure-Python parser
# took 0.25 s of it (most of a sweep job's own harness time; docs/benchmarks.md).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PACKAGES = ("spec-decode-bench", "sglang", "torch", "transformers", "mlflow", "dvc", "hydra-core")


def _run(argv: list[str], cwd: str | None = None) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=cwd, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


# Files that `dvc repro` itself rewrites: a change there does not make a result un-rebuildable.
DVC_MANAGED = ("experiments/", "dvc.lock")


def git_state(root: Path) -> dict:
    commit = _run(["git", "rev-parse", "HEAD"], str(root))
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], str(root))
    if status is None:
        return {"commit": commit, "dirty": None, "dirty_paths": []}
    paths = [line.split(None, 1)[1] for line in status.splitlines() if len(line.split(None, 1)) == 2]
    code = [p for p in paths if not p.startswith(DVC_MANAGED)]
    return {"commit": commit, "dirty": bool(paths), "dirty_paths": paths[:20], "code_dirty": bool(code)}


def working_tree(root: Path) -> str | None:
    """The git tree hash of the files a job runs from (tracked and untracked, less what git ignores), as
    ``git write-tree`` would give after ``git add -A``, through a copy of the index (the checkout's own index
    is not touched). Where the .git lags the files (a device's copy of a checkout keeps the session's first
    .git under newer files: git calls the newer files dirty), the tree still names what ran: the commit whose
    tree it is (``views.starts``). None when git cannot say."""
    index = _run(["git", "rev-parse", "--git-path", "index"], str(root))
    if index is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "index"
        if (root / index).is_file():
            shutil.copyfile(root / index, tmp)  # stat data kept: only changed files are hashed again
        env = {**os.environ, "GIT_INDEX_FILE": str(tmp)}
        try:
            subprocess.run(["git", "add", "-A"], cwd=root, env=env, capture_output=True, timeout=15, check=True)
            out = subprocess.run(["git", "write-tree"], cwd=root, env=env, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


@lru_cache(maxsize=1)
def packages() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


@lru_cache(maxsize=1)
def machine() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
    }


def gpu_facts() -> dict | None:
    """GPU names, driver and topology where nvidia-smi exists; None on a CPU-only machine."""
    names = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if not names:
        return None
    # The NCCL version torch loads (torch is not imported by the runner itself: ask a child).
    nccl = _run([sys.executable, "-c", "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))"])
    return {"gpus": names.splitlines(), "topology": _run(["nvidia-smi", "topo", "-m"]), "torch_nccl_version": nccl}


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@lru_cache(maxsize=4)
def _parsed_lock(path: str, mtime_ns: int, size: int) -> dict:
    """dvc.lock parsed, once per version of the file (a sweep's jobs share one process)."""
    return yaml.load(Path(path).read_text(), Loader=_SAFE_LOADER) or {}


def dvc_hashes(root: Path, paths: list[str] | None = None) -> dict[str, str]:
    """path -> md5 of every stage output and dependency in dvc.lock, and of the ``<path>.dvc`` files
    of the given paths (looked up directly: walking the tree costs seconds in a big checkout)."""
    out: dict[str, str] = {}
    lock = root / "dvc.lock"
    if lock.exists():
        st = lock.stat()
        data = _parsed_lock(str(lock), st.st_mtime_ns, st.st_size)
        for stage in (data.get("stages") or {}).values():
            for entry in (stage.get("outs") or []) + (stage.get("deps") or []):
                if "md5" in entry:
                    out[entry["path"]] = entry["md5"]
    for p in paths or []:
        dvc_file = root / f"{p}.dvc"
        if not dvc_file.is_file():
            continue
        try:
            for entry in (yaml.load(dvc_file.read_text(), Loader=_SAFE_LOADER) or {}).get("outs", []):
                out[str((dvc_file.parent / entry["path"]).relative_to(root))] = entry.get("md5", "")
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
            continue
    return out


def data_hashes(root: Path, paths: dict[str, str | None]) -> dict[str, dict]:
    """For each named input (target, drafter, prompts): its DVC md5 when DVC tracks it, else the
    sha256 of the file (or of config.json + model.safetensors for a model directory)."""
    dvc = dvc_hashes(root, [p for p in paths.values() if p])
    out: dict[str, dict] = {}
    for name, p in paths.items():
        if not p:
            continue
        path = Path(p)
        rel = str(path.resolve().relative_to(root.resolve())) if path.resolve().is_relative_to(root.resolve()) else p
        if rel in dvc:
            out[name] = {"path": rel, "dvc_md5": dvc[rel]}
            continue
        full = path if path.is_absolute() else root / path
        if full.is_file():
            out[name] = {"path": rel, "sha256": sha256_file(full)}
        elif full.is_dir():
            files = [full / f for f in ("config.json", "model.safetensors") if (full / f).exists()]
            h = hashlib.sha256()
            for f in files:
                h.update(sha256_file(f).encode())
            out[name] = {"path": rel, "sha256": h.hexdigest() if files else None}
        else:
            out[name] = {"path": rel, "missing": True}
    return out


def collect(root: Path, inputs: dict[str, str | None]) -> Provenance:
    return Provenance(
        root=str(root.resolve()),
        git={**git_state(root), "tree": working_tree(root)},
        packages=packages(),
        machine=machine(),
        gpu=gpu_facts(),
        host=fingerprint(),  # CPU model + ISA, cores, GPUs + clocks, NCCL (runner/machine.py)
        data=data_hashes(root, inputs),
    )
