"""Preflight's items, one part each: the local facts (weights on disk, in git or DVC; visible GPUs), synthetic
models, the drafter against its target, the request prompts, the load protocol. preflight.check runs
them in order; each failure says what to do."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from spec_decode.core import drafter
from spec_decode.core.config import ExperimentConfig
from spec_decode.core.prompts import load_prompt_set
from spec_decode.core.synthetic import generated_matches, load_table
from spec_decode.engines.engine import engine_of


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


def read_json(path: Path, pf: Preflight, what: str) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        pf.errors.append(f"{path}: {what} is not valid JSON ({e.msg} at line {e.lineno}); fix or re-pull it")
        return None
    if not isinstance(data, dict):
        pf.errors.append(f"{path}: {what} must be a JSON object")
        return None
    return data


def _stat_key(p: Path) -> tuple | None:
    try:
        s = p.stat()
    except OSError:
        return None
    return (s.st_mtime_ns, s.st_size, s.st_ino)


# (root, path, dvc.yaml and dvc.lock as they were) -> the answer DVC gave: a sweep's jobs run in one
# process and ask the same question once each; every ask opened the repo and parsed dvc.lock (~0.6 s of
# CPU per job, 8 of them in a GPU sweep's dry run). A changed dvc.yaml or dvc.lock asks DVC again.
_DVC_TRACKED: dict[tuple, bool] = {}


def dvc_tracked(root: Path, path: str) -> bool:
    """Whether DVC tracks ``path`` (a .dvc file or a stage output), asked of DVC itself. Only where weights
    are missing (a local path, or a hub id not in the cache): opening the repo costs a second (once per
    process for the same files)."""
    if (root / f"{path}.dvc").exists():
        return True
    if not (root / "dvc.yaml").exists():
        return False
    key = (str(root.resolve()), path, _stat_key(root / "dvc.yaml"), _stat_key(root / "dvc.lock"))
    if key not in _DVC_TRACKED:
        _DVC_TRACKED[key] = _ask_dvc(root, path)
    return _DVC_TRACKED[key]


def _ask_dvc(root: Path, path: str) -> bool:
    # lazy: importing dvc costs ~1 s, paid only for a missing weights path
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return bool(repo.find_outs_by_path(str(root / path)))
    except DvcException:
        return False


def has_weights(model_dir: Path) -> bool:
    """config.json plus at least one weights file (safetensors, possibly sharded, or a torch .bin)."""
    if not (model_dir / "config.json").is_file():
        return False
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin"))


def git_tracked(root: Path, path: str) -> bool:
    """Whether git tracks files under ``path`` (the index still lists what was deleted from the tree)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--", path], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def missing_weights(root: Path, path: str, flag: str) -> str:
    if git_tracked(root, path):  # the tiny models live in git: DVC would answer "Everything is up to date"
        return f"{flag}={path}: weights not found (config.json + *.safetensors); run `git checkout -- {path}`"
    hint = f"run `dvc pull {path}`"
    if not dvc_tracked(root, path):  # nothing to pull: say so first
        hint = (
            f"this repo has no DVC pointer for it yet (`dvc pull` has nothing to fetch): put the weights at {path}, "
            f"then `dvc add {path} && dvc push` and commit {path}.dvc so that the next machine can pull them"
        )
    return f"{flag}={path}: weights not found (config.json + *.safetensors); {hint}"


def visible_gpus() -> int | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check_synthetic(cfg: ExperimentConfig, root: Path, pf: Preflight) -> None:
    """Synthetic (random-weight) models: a speculative job forces acceptance, and the weights on disk
    are the ones the conf's seed and shape make (else: the command that generates them)."""
    parts = [("model", cfg.model)] + ([("drafter", cfg.drafter)] if cfg.speculative else [])
    parts = [(group, c) for group, c in parts if c.synthetic is not None]
    table = cfg.spec.simulate_accept_table
    if table is not None and cfg.speculative:
        entry = load_table(table).at(cfg.spec.steps)  # to_experiment has resolved it: it exists
        if not entry.published:
            pf.warnings.append(
                f"spec.simulate_accept_table={table} at spec.steps={cfg.spec.steps}: accept length "
                f"{entry.accept_len} is not a published number ({entry.source})"
            )
    if not parts:
        return
    names = " and ".join(f"{group}={c.name}" for group, c in parts)
    if cfg.speculative:
        pf.need(
            cfg.spec.simulate_accept_len is not None,
            f"{names} has random (synthetic) weights, so its acceptance means nothing: set "
            "spec.simulate_accept_len=<x> or spec.simulate_accept_table=<name> (forced acceptance, "
            "performance-only)",
        )
    command = f"python -m spec_decode build synthetic --model {cfg.model.name}"
    if cfg.speculative and cfg.drafter.synthetic is not None:
        command += f" --drafter {cfg.drafter.name}"
    for group, c in parts:
        path = Path(str(c.path))
        why = generated_matches(path if path.is_absolute() else root / path, c.synthetic)
        pf.need(
            why is None,
            f"{group}.path={c.path}: {why}; run `{command} --device {cfg.hardware.device}`",
            local=True,
            dry_run=cfg.dry_run,
        )


def check_drafter(cfg: ExperimentConfig, root: Path, pf: Preflight, tcfg: dict | None, n_layers: int | None) -> None:
    d = cfg.drafter
    path = Path(str(d.path))
    full = path if path.is_absolute() else root / path
    if not has_weights(full) and d.synthetic is not None:
        return  # check_synthetic names the command that generates it
    if not has_weights(full):
        pf.need(False, missing_weights(root, str(d.path), "drafter.path"), local=True, dry_run=cfg.dry_run)
        if not (full / "config.json").is_file():  # a config.json alone still gets every check below
            return
    dcfg = read_json(full / "config.json", pf, "the drafter's config.json")
    if dcfg is None:
        return
    served = drafter.configured_layer_ids(dcfg)  # None: SGLang's default capture
    target = tcfg if tcfg else ({"num_hidden_layers": n_layers} if n_layers else None)
    # Layer-id mismatches stop the job unless the experiment asks for them on purpose; compared as the
    # target layers captured under the target family's rule (spec_decode.core.drafter).
    allow = cfg.preflight.allow_layer_id_mismatch
    mismatches = pf.warnings if allow else pf.errors
    note = "allowed by preflight.allow_layer_id_mismatch=true: " if allow else ""
    try:
        trained = drafter.trained_layer_ids(full)
    except ValueError as e:
        pf.errors.append(str(e))
        trained = None
    ids = list(d.layer_ids) if d.layer_ids is not None else None
    if ids is not None and (m := drafter.embedding_capture(ids, trained, served, d.name, target)) is not None:
        mismatches.append(note + m)  # -1 named for what it is, not as another mismatch
    elif ids is not None and not drafter.same_layers(served, ids, target):
        mismatches.append(
            f"{note}drafter={d.name}: the checkpoint has {drafter.describe(served, target)} "
            f"(eagle_config.{drafter.LAYER_IDS_KEY}) but drafter.layer_ids is "
            f"{drafter.describe(ids, target)}; fix whichever is wrong"
        )
    where = str(full / "config.json")
    pf.errors.extend(drafter.problems(dcfg, target, where))
    if (m := drafter.trained_mismatch(trained, served, where, target)) is not None:
        mismatches.append(note + m)


def _prompt_set(pf: Preflight, root: Path, key: str, value: str, why: str) -> list | None:
    """benchmark.<key>'s prompt set, or None with the error recorded (the file missing: ``why`` it is needed)."""
    path = Path(value) if Path(value).is_absolute() else root / value
    if not pf.need(path.is_file(), f"benchmark.{key}={value}: file not found ({why})"):
        return None
    try:
        return load_prompt_set(path)
    except ValueError as e:
        pf.errors.append(f"benchmark.{key}: {e}")
        return None


def _fits_context(
    pf: Preflight, cfg: ExperimentConfig, tcfg: dict | None, items: list, key: str, new_tokens: int, prompts: str
) -> None:
    """On the embedded engine (one byte a token), each prompt + ``new_tokens`` (benchmark.<key>) + a draft
    fits the target's context."""
    if not tcfg or not engine_of(cfg).byte_tokens:
        return
    ctx = tcfg.get("max_position_embeddings", 0)
    extra = new_tokens + ((cfg.spec.steps + 1) if cfg.speculative else 0)
    too_long = [p.index for p in items if len(p.text.encode()) + extra > ctx]
    pf.need(
        not too_long,
        f"benchmark.{key}={new_tokens}: prompts {too_long[:5]} of {Path(prompts).name} + new tokens + draft "
        f"exceed the model's context of {ctx}",
    )


def check_request_prompts(cfg: ExperimentConfig, root: Path, pf: Preflight, tcfg: dict | None) -> None:
    """benchmark.request_prompts loads (categories valid) and each prompt fits the context."""
    b = cfg.benchmark
    items = _prompt_set(pf, root, "request_prompts", b.request_prompts, "benchmark.request_pass=true needs it")
    if items is None:
        return
    _fits_context(pf, cfg, tcfg, items, "request_max_new_tokens", b.request_max_new_tokens, b.request_prompts)


def check_load(cfg: ExperimentConfig, root: Path, pf: Preflight, tcfg: dict | None) -> None:
    """benchmark.concurrency fits what the server holds (its running batch and its CUDA graphs; a batch
    above them queues or decodes eagerly, so the figure would not be that concurrency's), and the
    load prompts load and fit the context."""
    b, e, eng = cfg.benchmark, cfg.engine, engine_of(cfg)
    n = b.concurrency
    cap, key = getattr(e, "max_running_requests", None), "engine.max_running_requests"
    if cap is None and (default := eng.default_max_running(cfg.speculative)) is not None:
        cap, key = default, f"engine.max_running_requests (null: SGLang's {default} with speculation)"
    if cap is not None:
        pf.need(
            n <= cap,
            f"benchmark.concurrency={n} is above {key}={cap}: the server runs at most {cap} requests "
            f"at once and queues the rest, so the running batch never reaches {n}; raise "
            f"engine.max_running_requests to >= {n} or lower benchmark.concurrency",
        )
    max_bs = getattr(e, "cuda_graph_max_bs_decode", None)
    graphs = eng.decodes_with_graphs(cfg) and max_bs is not None
    if graphs and not eng.refuses_eager_overflow and n > max_bs:
        pf.warnings.append(
            f"benchmark.concurrency={n} is above engine.cuda_graph_max_bs_decode={max_bs}: the "
            f"embedded engine's batches of more than {max_bs} requests run its static shapes eagerly "
            "(no CUDA graph), so the figure measures that fallback; raise "
            f"engine.cuda_graph_max_bs_decode to >= {n} (or null) to measure graphs"
        )
    if graphs and eng.refuses_eager_overflow:
        pf.need(
            n <= max_bs,
            f"benchmark.concurrency={n} is above engine.cuda_graph_max_bs_decode={max_bs}: batches "
            f"of more than {max_bs} requests decode without CUDA graphs, so the figure would measure eager "
            f"decoding; raise engine.cuda_graph_max_bs_decode to >= {n} (or add --disable-cuda-graph to "
            "engine.extra_args to measure eager on purpose)",
        )
    items = _prompt_set(
        pf, root, "load_prompts", b.load_prompts, f"the load protocol of benchmark.concurrency={n} sends its prompts"
    )
    if items is None:
        return
    _fits_context(pf, cfg, tcfg, items, "max_new_tokens", b.max_new_tokens, b.load_prompts)


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


def gpu_type_mismatch(gpu_type: str | None, facts: dict | None) -> str | None:
    """The hardware profile's gpu_type against nvidia-smi's GPU names: the refusal, or None without GPUs,
    without a gpu_type, or when they agree. An error, not a warning: the profile's name is the record's
    hardware label, and a run on another GPU would be reported as this one (2026-12-05: a sweep labelled
    h200x1 ran on an H100 after one warning line)."""
    if not gpu_type or not facts or not facts.get("gpus"):
        return None
    names = sorted({g.split(",")[0].strip() for g in facts["gpus"]})
    if any(gpu_type.lower() in n.lower() or n.lower() in gpu_type.lower() for n in names):
        return None
    return (
        f"hardware.gpu_type={gpu_type!r} but nvidia-smi reports {names}: choose this box's hardware profile "
        "(hardware=..., conf/hardware/) or add one; its name is the label of every record"
    )


def interconnect_mismatch(interconnect: str, tp_size: int, facts: dict | None) -> str | None:
    """The hardware profile's interconnect against ``nvidia-smi topo -m`` between the first tp_size GPUs
    (a warning: the label is descriptive, and a topology read can be partial)."""
    if not facts or not facts.get("gpus"):
        return None
    links = topology_links(facts.get("topology"), tp_size)
    if links and interconnect in ("pcie", "nvlink") and links != {interconnect}:
        return (
            f"hardware.interconnect={interconnect} but `nvidia-smi topo -m` shows {sorted(links)} links "
            f"between the first {tp_size} GPUs: fix the hardware profile"
        )
    return None
