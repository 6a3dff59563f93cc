"""Preflight: every check that needs no server, before any launch. Each failure says what to do.

Errors stop the job before a server starts; in a dry run the checks that need the weights or the
GPUs on this machine become warnings (the user is checking a GPU sweep from a laptop).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .config import ExperimentConfig

DRAFTER_ARCH = "LlamaForCausalLMEagle3"

# NCCL environment variables (NCCL user guide, "Environment Variables"): a typo such as NCCL_PROTOCOL
# is silently ignored by NCCL, so we refuse names outside this list.
NCCL_VARIABLES = {
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_P2P_DIRECT_DISABLE", "NCCL_P2P_READ_ENABLE",
    "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_SHM_DISABLE", "NCCL_SHM_USE_CUDA_MEMCPY", "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC",
    "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX",
    "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_NET", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
    "NCCL_NET_PLUGIN", "NCCL_TOPO_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "NCCL_COLLNET_ENABLE", "NCCL_BUFFSIZE",
    "NCCL_NTHREADS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MIN_NRINGS",
    "NCCL_CHECKS_DISABLE", "NCCL_CHECK_POINTERS", "NCCL_LAUNCH_MODE", "NCCL_IB_CUDA_SUPPORT",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVB_DISABLE", "NCCL_PXN_DISABLE", "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE", "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD",
    "NCCL_LL128_BUFFSIZE", "NCCL_LL128_NTHREADS", "NCCL_SINGLE_RING_THRESHOLD", "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT", "NCCL_CUMEM_HOST_ENABLE", "NCCL_NVLS_NCHANNELS", "NCCL_WORK_FIFO_DEPTH",
    "NCCL_RUNTIME_CONNECT", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS",
    "NCCL_CGA_CLUSTER_SIZE", "NCCL_SET_THREAD_NAME", "NCCL_GRAPH_DUMP_FILE", "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
}


class PreflightError(ValueError):
    """A job that must not start. The message names the key or file and says what to do."""


@dataclass
class Preflight:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def need(self, ok: bool, message: str, *, local: bool = False, dry_run: bool = False) -> bool:
        """Record ``message`` unless ``ok``. ``local`` marks checks of this machine's files/GPUs,
        which a dry run only warns about."""
        if not ok:
            (self.warnings if (local and dry_run) else self.errors).append(message)
        return ok


def _read_json(path: Path, pf: Preflight, what: str) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        pf.errors.append(f"{path}: {what} is not valid JSON ({e.msg} at line {e.lineno}); fix or re-pull it")
        return None
    if not isinstance(data, dict):
        pf.errors.append(f"{path}: {what} must be a JSON object")
        return None
    return data


def _dvc_tracked(root: Path, path: str) -> bool:
    if (root / f"{path}.dvc").exists():
        return True
    dvc_yaml = root / "dvc.yaml"
    return dvc_yaml.exists() and path in dvc_yaml.read_text()


def has_weights(model_dir: Path) -> bool:
    """config.json plus at least one weights file (safetensors, possibly sharded, or a torch .bin)."""
    if not (model_dir / "config.json").is_file():
        return False
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin"))


def _missing_weights(root: Path, path: str, flag: str) -> str:
    hint = f"run `dvc pull {path}`"
    if not _dvc_tracked(root, path):
        hint += (" (this repo has no DVC pointer for it yet: where the weights live, "
                 f"`dvc add {path} && dvc push`, and commit {path}.dvc)")
    return f"{flag}={path}: weights not found (config.json + *.safetensors); {hint}"


def visible_gpus() -> int | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check(cfg: ExperimentConfig, root: Path) -> Preflight:
    pf = Preflight()
    dry = cfg.dry_run

    # NCCL names: a typo is silently ignored by NCCL and the tuning is gone.
    for name in cfg.nccl.env:
        pf.need(name in NCCL_VARIABLES,
                f"nccl={cfg.nccl.name}: {name} is not an NCCL variable (typo?); see the NCCL user "
                "guide's environment variables")
    if cfg.nccl.env and cfg.hardware.device == "cpu":
        pf.warnings.append(f"nccl={cfg.nccl.name} sets NCCL variables on a CPU profile: they reach the "
                           "server but nothing there uses NCCL")

    # Target weights.
    model_dir = Path(cfg.model.path)
    model_dir = model_dir if model_dir.is_absolute() else root / model_dir
    tcfg: dict | None = None
    if has_weights(model_dir):
        tcfg = _read_json(model_dir / "config.json", pf, "the model's config.json")
    elif cfg.engine.name == "sglang" and not model_dir.exists() and cfg.model.path.count("/") == 1 \
            and not cfg.model.path.startswith((".", "/")):
        pf.warnings.append(f"model.path={cfg.model.path} is not a local directory: SGLang must find it in "
                           "the Hugging Face cache (HF_HUB_OFFLINE=1, nothing is downloaded)")
    else:
        pf.need(False, _missing_weights(root, cfg.model.path, "model.path"), local=True, dry_run=dry)
    n_layers = (tcfg or {}).get("num_hidden_layers", cfg.model.num_layers)

    # Drafter: architecture, layer ids (config vs served vs trained), shapes.
    if cfg.speculative:
        _check_drafter(cfg, root, pf, tcfg, n_layers)

    # Prompts.
    prompts = root / cfg.benchmark.prompts if not Path(cfg.benchmark.prompts).is_absolute() \
        else Path(cfg.benchmark.prompts)
    if pf.need(prompts.is_file(), f"benchmark.prompts={cfg.benchmark.prompts}: file not found"):
        try:
            items = load_prompts(prompts)
        except ValueError as e:
            pf.errors.append(str(e))
            items = []
        if items and pf.need(cfg.benchmark.prompt_index < len(items),
                             f"benchmark.prompt_index={cfg.benchmark.prompt_index}: {prompts.name} has "
                             f"{len(items)} prompts (0..{len(items) - 1})") and tcfg:
            ctx = tcfg.get("max_position_embeddings", 0)
            need = len(items[cfg.benchmark.prompt_index].encode()) + cfg.benchmark.max_new_tokens
            need += (cfg.spec.steps + 1) if cfg.speculative else 0
            if cfg.engine.name == "embedded":
                pf.need(need <= ctx, f"benchmark.max_new_tokens={cfg.benchmark.max_new_tokens}: prompt + "
                        f"new tokens + draft = {need} tokens exceed the model's context of {ctx}")

    # Tensor parallel: the target's heads and MLP columns split evenly over the ranks (SGLang
    # asserts the same at load time).
    tp = cfg.hardware.tp_size
    if tcfg and tp > 1:
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            n = tcfg.get(key)
            if isinstance(n, int):
                pf.need(n % tp == 0, f"hardware.tp_size={tp}: the target's {key} is {n}, which tp "
                        f"{tp} does not divide; use a tp size that divides {n}")
    if cfg.hardware.device == "cpu" and tp > 1:
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if cores and tp > cores:
            pf.warnings.append(f"hardware.tp_size={tp} ranks on {cores} CPU cores: the ranks share "
                               "cores, so tok/s measures contention as much as the engine")
    # GPUs.
    if cfg.hardware.device == "cuda":
        n = visible_gpus()
        pf.need(n is not None and n >= cfg.hardware.tp_size,
                f"hardware={cfg.hardware.name} needs {cfg.hardware.tp_size} GPU(s) for tp "
                f"{cfg.hardware.tp_size}; {n or 0} visible here", local=True, dry_run=dry)
    # A reported experiment from a dirty tree cannot be rebuilt from its commit.
    if cfg.name != "adhoc":
        from .provenance import git_state

        if git_state(root).get("code_dirty"):
            pf.warnings.append(f"experiment={cfg.name} runs from a dirty git tree: commit first, or the "
                               "result's git.commit does not rebuild it")
    if cfg.engine.name == "sglang":
        from .engines.sglang import installed_version, version_warning

        pf.need(installed_version() is not None,
                "engine=sglang: sglang is not installed; pip install -e '.[sglang]' on the GPU box",
                local=True, dry_run=dry)
        if (w := version_warning()) is not None:
            pf.warnings.append(w)
        if cfg.benchmark.profile and cfg.speculative and installed_version() is not None:
            # First contact: our profiler must be installed and its hook targets must exist in this
            # sglang, or every phase number of the sweep would be missing.
            from . import doctor

            for item in doctor.static_checks("sglang")[1:]:
                pf.need(item.ok, f"self-check: {item.name}: {item.detail}; what to do: {item.fix} "
                        "(or benchmark.profile=false to run without the phase profile)",
                        local=True, dry_run=dry)
    return pf


def _check_drafter(cfg: ExperimentConfig, root: Path, pf: Preflight, tcfg: dict | None,
                   n_layers: int | None) -> None:
    d = cfg.drafter
    path = Path(str(d.path))
    full = path if path.is_absolute() else root / path
    if not has_weights(full):
        pf.need(False, _missing_weights(root, str(d.path), "drafter.path"), local=True, dry_run=cfg.dry_run)
        return
    dcfg = _read_json(full / "config.json", pf, "the drafter's config.json")
    if dcfg is None:
        return
    arch = dcfg.get("architectures")
    pf.need(arch == [DRAFTER_ARCH],
            f"{full / 'config.json'}: architectures is {arch!r}; SGLang loads an EAGLE-3 drafter only as "
            f"[\"{DRAFTER_ARCH}\"] (it does not rewrite the name)")
    served = (dcfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if served is None and n_layers:
        served = [1, n_layers // 2 - 1, n_layers - 4]  # what SGLang captures by default
    if d.layer_ids is not None and served is not None:
        pf.need(list(served) == list(d.layer_ids),
                f"drafter={d.name}: the checkpoint serves layer ids {list(served)} "
                f"(eagle_config.eagle_aux_hidden_state_layer_ids) but drafter.layer_ids is "
                f"{list(d.layer_ids)}; fix whichever is wrong")
    if served is not None and n_layers:
        pf.need(all(isinstance(i, int) and 0 <= i <= n_layers - 2 for i in served) and len(served) == 3,
                f"{full / 'config.json'}: layer ids {served} must be 3 ids in 0..{n_layers - 2} for the "
                f"{n_layers}-layer target")
    record = full / "training.json"
    if record.is_file() and served is not None:
        rec = _read_json(record, pf, "the drafter's training record")
        trained = (rec or {}).get("trained_aux_layer_ids")
        if trained is not None:
            pf.need(list(trained) == list(served),
                    f"drafter={d.name}: trained on target layers {list(trained)} (training.json) but "
                    f"served with layer ids {list(served)} (config.json eagle_config): acceptance would "
                    "collapse; serve it with the ids it was trained on or retrain it")
    if tcfg:
        pf.need(dcfg.get("hidden_size") == tcfg.get("hidden_size")
                or dcfg.get("target_hidden_size") == tcfg.get("hidden_size"),
                f"drafter hidden size {dcfg.get('hidden_size')} does not fit the target's "
                f"{tcfg.get('hidden_size')}")
        pf.need(dcfg.get("vocab_size") == tcfg.get("vocab_size"),
                f"drafter vocab_size {dcfg.get('vocab_size')} != target vocab_size {tcfg.get('vocab_size')}")
        dv = dcfg.get("draft_vocab_size", dcfg.get("vocab_size"))
        pf.need(isinstance(dv, int) and dv <= (tcfg.get("vocab_size") or 0),
                f"drafter draft_vocab_size {dv} exceeds the target vocab ({tcfg.get('vocab_size')})")


def load_prompts(path: Path) -> list[str]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise ValueError(f"{path}:{i}: each line needs a \"text\" string")
        out.append(item["text"])
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def run(cfg: ExperimentConfig, root: Path) -> list[str]:
    """Raise PreflightError listing every error; return the warnings."""
    pf = check(cfg, root)
    if pf.errors:
        raise PreflightError("preflight failed:\n  - " + "\n  - ".join(pf.errors))
    return pf.warnings
