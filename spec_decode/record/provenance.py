"""Provenance: what explains a number. Git state, packages, machine, the server's real environment
(read back from the live process, filtered and with secrets redacted), GPU/NCCL facts, file hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from spec_decode.record import host

ENV_PREFIXES = (
    "NCCL_",
    "SGLANG_",
    "CUDA_",
    "TORCH_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "SPEC_DECODE_",
    "OMP_NUM_THREADS",
)
# Set by the engine for each launch, never a setting: SGLang writes a fresh SGLANG_RUN_ID into its
# launcher's environment (srt/entrypoints/engine.py: 0.5.17 1613, 0.5.23 1936), which its ranks
# inherit. Kept out of the record's environment, or every comparison of two launches (the drift guard)
# would call it a change.
PER_LAUNCH = frozenset({"SGLANG_RUN_ID"})
SECRET = re.compile(r"(TOKEN|_KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
REDACTED = "***redacted***"
# libyaml's parser where PyYAML has it: dvc.lock is read for every job, and the pure-Python parser
# took 0.25 s of it (most of a sweep job's own harness time; docs/benchmarks.md).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PACKAGES = ("spec-decode-bench", "sglang", "torch", "transformers", "mlflow", "dvc", "hydra-core")


# Names the pattern matches that are settings, not secrets (exact names only).
NOT_SECRET = frozenset({"SGLANG_SIMULATE_ACC_TOKEN_MODE"})  # SGLang's forced-acceptance token mode


def is_secret(name: str) -> bool:
    return name not in NOT_SECRET and bool(SECRET.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def filter_env(env: dict[str, str]) -> dict[str, str]:
    """The variables that change a server's behaviour, secrets redacted, sorted."""
    return redact_env({k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) and k not in PER_LAUNCH})


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of secret-looking variables in our environment (to scrub from anything we write)."""
    env = os.environ if env is None else env
    return [v for k, v in env.items() if is_secret(k) and len(v) >= 6]


def scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, REDACTED)
    return text


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


def collect(root: Path, inputs: dict[str, str | None]) -> dict:
    return {
        "root": str(root.resolve()),
        "git": git_state(root),
        "packages": packages(),
        "machine": machine(),
        "gpu": gpu_facts(),
        "host": host.fingerprint(),  # CPU model + ISA, cores, GPUs + clocks, NCCL (record/host.py)
        "data": data_hashes(root, inputs),
    }


def dumps_clean(obj: object, secrets: list[str]) -> str:
    return scrub(json.dumps(obj, indent=2, sort_keys=False, default=str), secrets)


def rank_environment(tree: dict, launcher_pid: int | None) -> dict:
    """The environment the server's ranks really ran with, from every process of its tree ({pid: env},
    read back from /proc): the launcher's children are the ranks (SGLang's schedulers, our engine's
    rank processes). A launcher that writes ``os.environ`` before it spawns them (SGLang does:
    NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE, NCCL_GRAPH_REGISTER, NCCL_ALGO under
    --enable-deterministic-inference; spec_decode.engines.sglang.ENV_WRITES) never shows those writes
    in its own /proc environ, so the launcher is not the reference.

    Returns ``env`` (the ranks' variables, filtered; the launcher's when it has no children),
    ``set_by_engine`` (filtered variables the ranks hold with another value than the launcher was
    started with: the engine's own writes) and ``differing`` ({name: {pid: value}} for variables the
    ranks themselves disagree on; empty when they agree)."""
    envs = {str(pid): filter_env(env) for pid, env in tree.items()}
    launcher = envs.get(str(launcher_pid), {})
    # A process whose environment reads back empty (a zombie, an exec with env={}) tells nothing about
    # what the ranks ran with: on real SGLang 0.5.17 at tp 1, two such children of the launcher made the
    # ranks "disagree" on every NCCL variable (docs/sglang-route.md).
    readable = {str(pid) for pid, env in tree.items() if env}
    ranks = {pid: env for pid, env in envs.items() if pid != str(launcher_pid) and pid in readable} or {
        str(launcher_pid): launcher
    }
    first = next(iter(ranks.values()), {})
    names = sorted({k for env in ranks.values() for k in env})
    differing = {
        k: {pid: env.get(k) for pid, env in ranks.items()}
        for k in names
        if len({env.get(k) for env in ranks.values()}) > 1
    }
    set_by_engine = {k: v for k, v in first.items() if launcher.get(k) != v and k not in differing}
    return {
        "env": first,
        "set_by_engine": set_by_engine if launcher_pid is not None and len(envs) > 1 else {},
        "differing": differing,
    }


def topology_links(topo: str | None, n: int) -> set[str]:
    """The link kinds between the first ``n`` GPUs in ``nvidia-smi topo -m``: ``nvlink`` (NV#) and/or
    ``pcie`` (PIX, PXB, PHB, NODE, SYS); empty when the matrix is not there."""
    rows = [
        line.split()
        for line in (topo or "").splitlines()
        if re.match(r"GPU\d+\s", line) and not re.match(r"GPU\d+\s+GPU\d+", line)
    ]  # not the header
    kinds: set[str] = set()
    for i, row in enumerate(rows[:n]):
        for j, cell in enumerate(row[1 : n + 1]):
            if j == i:
                continue
            if re.fullmatch(r"NV\d+", cell):
                kinds.add("nvlink")
            elif cell in ("PIX", "PXB", "PHB", "NODE", "SYS"):
                kinds.add("pcie")
    return kinds


def hardware_mismatches(gpu_type: str | None, interconnect: str, tp_size: int, facts: dict | None) -> list[str]:
    """What the hardware profile claims (gpu_type, interconnect) against what this box reports
    (nvidia-smi's GPU names, ``nvidia-smi topo -m``); empty without GPUs or when they agree."""
    if not facts or not facts.get("gpus"):
        return []
    out = []
    names = sorted({g.split(",")[0].strip() for g in facts["gpus"]})
    if gpu_type and not any(gpu_type.lower() in n.lower() or n.lower() in gpu_type.lower() for n in names):
        out.append(
            f"hardware.gpu_type={gpu_type!r} but nvidia-smi reports {names}: fix the hardware profile "
            "(its label goes into every record)"
        )
    links = topology_links(facts.get("topology"), tp_size)
    if links and interconnect in ("pcie", "nvlink") and links != {interconnect}:
        out.append(
            f"hardware.interconnect={interconnect} but `nvidia-smi topo -m` shows {sorted(links)} links "
            f"between the first {tp_size} GPUs: fix the hardware profile"
        )
    return out
