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


UNTRACKED_CAP = (50, 64 << 20)  # files, bytes: past either, no tree (hashing them would stall a job)


def working_files(root: Path) -> dict | None:
    """What the files a job runs from are, to git: ``tree``, the tree hash of every file git does not ignore
    (``git add -A`` then ``git write-tree``), and ``untracked``, ``[mode, blob, path]`` of those the index does
    not track. Through a copy of the index and a scratch object directory (the checkout's .git gets nothing).
    Where the .git lags the files (a device's copy of a checkout keeps the session's first .git under newer
    files: git calls the newer files dirty), the tree still names what ran: the commit whose tree it is, plus
    the untracked files no commit holds (``views.starts.resolve``). None when git cannot say, or past
    ``UNTRACKED_CAP``."""
    top = _run(["git", "rev-parse", "--show-toplevel"], str(root))
    paths = _run(["git", "rev-parse", "--path-format=absolute", "--git-path", "index", "--git-path", "objects"], top)
    if not top or not paths or len(paths.splitlines()) != 2:
        return None
    index, objects = map(Path, paths.splitlines())
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-o", "--exclude-standard", "-z"], cwd=top, capture_output=True, timeout=10, check=True
        ).stdout
        new = [x.decode() for x in listed.split(b"\0") if x]
        if len(new) > UNTRACKED_CAP[0] or sum(os.lstat(Path(top) / x).st_size for x in new) > UNTRACKED_CAP[1]:
            return None
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "objects").mkdir()  # git wants the directory there
            if index.is_file():
                shutil.copy2(index, Path(d) / "index")  # its mtime too: git's check for files changed in that second
            env = {
                **os.environ,
                "GIT_INDEX_FILE": str(Path(d) / "index"),
                "GIT_OBJECT_DIRECTORY": str(Path(d) / "objects"),
                "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects),
            }
            subprocess.run(["git", "add", "-A"], cwd=top, env=env, capture_output=True, timeout=10, check=True)
            tree = subprocess.run(["git", "write-tree"], cwd=top, env=env, capture_output=True, text=True, timeout=10)
            staged = subprocess.run(  # with no paths, ls-files would list every file
                ["git", "ls-files", "-s", "-z", "--", *new] if new else ["true"],
                cwd=top,
                env=env,
                capture_output=True,
                timeout=10,
            )
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
    if tree.returncode != 0 or staged.returncode != 0 or not tree.stdout.strip():
        return None
    untracked = []
    for entry in (x.decode() for x in staged.stdout.split(b"\0") if x):  # "<mode> <blob> <stage>\t<path>"
        meta, _, path = entry.partition("\t")
        mode, blob, _ = meta.split(" ")
        untracked.append([mode, blob, path])
    return {"tree": tree.stdout.strip(), "untracked": untracked}


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
        git={**git_state(root), **(working_files(root) or {"tree": None})},
        packages=packages(),
        machine=machine(),
        gpu=gpu_facts(),
        host=fingerprint(),  # CPU model + ISA, cores, GPUs + clocks, NCCL (runner/machine.py)
        data=data_hashes(root, inputs),
    )
