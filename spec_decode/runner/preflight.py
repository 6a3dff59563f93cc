"""Preflight: every check that needs no server, before any launch. Each failure says what to do.

Errors stop the job before a server starts; in a dry run the checks that need the weights or the
GPUs on this machine become warnings (the user is checking a GPU sweep from a laptop).
"""

from __future__ import annotations

import os
from pathlib import Path

from spec_decode.core import drafter
from spec_decode.core.config import BenchmarkConfig, ExperimentConfig
from spec_decode.core.groups import HardwareConfig
from spec_decode.core.nccl_names import NCCL_VARIABLES
from spec_decode.core.prompts import load_prompts
from spec_decode.core.shapes import proj_split_problem
from spec_decode.engines import server_extra_env
from spec_decode.engines.engine import engine_of
from spec_decode.engines.server_process import PASSED_THROUGH, server_env
from spec_decode.record.results import PERFORMANCE_ONLY
from spec_decode.runner import doctor, pairing
from spec_decode.runner.hub_cache import check_hub_model, is_hub_id
from spec_decode.runner.preflight_items import (
    Preflight,
    check_drafter,
    check_load,
    check_request_prompts,
    check_synthetic,
    gpu_type_mismatch,
    has_weights,
    interconnect_mismatch,
    missing_weights,
    read_json,
    visible_gpus,
)
from spec_decode.runner.provenance import git_state, gpu_facts


class PreflightError(ValueError):
    """A job that must not start. The message names the key or file and says what to do."""


def inherited_nccl(cfg: ExperimentConfig, environ: dict[str, str]) -> str | None:
    """The NCCL variables exported in this shell, which the server never gets (engines.server_process drops them:
    the NCCL profile alone decides), named -- a user who exported NCCL_PROTO=LL must not believe it ran."""
    dropped = sorted(k for k in environ if k.startswith("NCCL_") and k not in PASSED_THROUGH)
    if not dropped:
        return None
    now = ", ".join(f"{k}={cfg.nccl.env[k]}" if k in cfg.nccl.env else f"{k} unset" for k in dropped)
    return (
        "NCCL variables exported in this shell are dropped from the server's environment: "
        + ", ".join(f"{k}={environ[k]}" for k in dropped)
        + f"; nccl={cfg.nccl.name} alone decides them (this job: {now}); to run with one, put it in the "
        f"profile, e.g. +nccl.env.{dropped[0]}={environ[dropped[0]]}"
    )


def check(cfg: ExperimentConfig, root: Path) -> Preflight:
    pf = Preflight()
    dry = cfg.dry_run

    # NCCL names: a typo is silently ignored by NCCL and the tuning is gone.
    for name in cfg.nccl.env:
        pf.need(
            name in NCCL_VARIABLES,
            f"nccl={cfg.nccl.name}: {name} is not an NCCL variable (typo?); see the NCCL user "
            "guide's environment variables",
        )
    if (w := inherited_nccl(cfg, dict(os.environ))) is not None:
        pf.warnings.append(w)
    if cfg.nccl.env and cfg.hardware.device == "cpu":
        pf.warnings.append(
            f"nccl={cfg.nccl.name} sets NCCL variables on a CPU profile: they reach the "
            "server but nothing there uses NCCL"
        )

    # Target weights.
    model_dir = Path(cfg.model.path)
    model_dir = model_dir if model_dir.is_absolute() else root / model_dir
    tcfg: dict | None = None
    if (model_dir / "config.json").is_file():  # the shape checks need only config.json, not the weights
        tcfg = read_json(model_dir / "config.json", pf, "the model's config.json")
    if has_weights(model_dir):
        pass  # the weights are here
    elif engine_of(cfg).resolves_hub_ids and is_hub_id(path := cfg.model.path, model_dir, root):
        # from the local cache only (the server is offline), as the server's environment names it
        tcfg = check_hub_model(path, model_dir, root, pf, dry, server_env(server_extra_env(cfg, None))) or tcfg
    elif cfg.model.synthetic is None:
        pf.need(False, missing_weights(root, cfg.model.path, "model.path"), local=True, dry_run=dry)
    check_synthetic(cfg, root, pf)
    lm = drafter.language_model(tcfg)  # Kimi-K2.5 nests its language model under text_config
    n_layers = drafter.num_layers(tcfg) or cfg.model.num_layers

    # Drafter: architecture, layer ids (config vs served vs trained), shapes.
    if cfg.speculative:
        check_drafter(cfg, root, pf, tcfg, n_layers)

    # Prompts.
    prompts = (
        root / cfg.benchmark.prompts if not Path(cfg.benchmark.prompts).is_absolute() else Path(cfg.benchmark.prompts)
    )
    if pf.need(prompts.is_file(), f"benchmark.prompts={cfg.benchmark.prompts}: file not found"):
        try:
            items = load_prompts(prompts)
        except ValueError as e:
            pf.errors.append(str(e))
            items = []
        if (
            items
            and pf.need(
                cfg.benchmark.prompt_index < len(items),
                f"benchmark.prompt_index={cfg.benchmark.prompt_index}: {prompts.name} has "
                f"{len(items)} prompts (0..{len(items) - 1})",
            )
            and tcfg
        ):
            ctx = lm.get("max_position_embeddings", 0)
            need = len(items[cfg.benchmark.prompt_index].encode()) + cfg.benchmark.max_new_tokens
            need += (cfg.spec.steps + 1) if cfg.speculative else 0
            if engine_of(cfg).byte_tokens:
                pf.need(
                    need <= ctx,
                    f"benchmark.max_new_tokens={cfg.benchmark.max_new_tokens}: prompt + "
                    f"new tokens + draft = {need} tokens exceed the model's context of {ctx}",
                )

    if cfg.benchmark.request_pass:
        check_request_prompts(cfg, root, pf, tcfg)
    if cfg.benchmark.under_load:
        check_load(cfg, root, pf, tcfg)

    # Tensor parallel: the target's heads and MLP columns split evenly over the ranks (SGLang
    # asserts the same at load time).
    tp = cfg.hardware.tp_size
    if tcfg and tp > 1:
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            n = lm.get(key)
            if isinstance(n, int):
                pf.need(
                    n % tp == 0,
                    f"hardware.tp_size={tp}: the target's {key} is {n}, which tp "
                    f"{tp} does not divide; use a tp size that divides {n}",
                )
    split = getattr(cfg.engine, "proj_split", 0)  # the embedded engine's (core.engine_config)
    if tcfg and (why := proj_split_problem(split, lm)):
        pf.errors.append(f"engine.proj_split={split}: {why}")
    if cfg.hardware.device == "cpu" and tp > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        useful = max(1, (cores or 1) - 1)  # one core goes to the runner, the client and the HTTP front
        if tp > useful:
            pf.warnings.append(
                f"hardware.tp_size={tp} ranks on {cores} CPU cores ({useful} useful beside the "
                "runner): the ranks share cores, so tok/s measures gloo all-reduce and contention, "
                "not speculation; use hardware.tp_size=1 here"
            )
    _placement(pf, cfg.benchmark, cfg.hardware, bool(cfg.paired), dry)
    # GPUs.
    if cfg.hardware.device == "cuda":
        n = visible_gpus()
        pf.need(
            n is not None and n >= cfg.hardware.tp_size,
            f"hardware={cfg.hardware.name} needs {cfg.hardware.tp_size} GPU(s) for tp "
            f"{cfg.hardware.tp_size}; {n or 0} visible here",
            local=True,
            dry_run=dry,
        )
        if n:  # the profile's labels against what the box reports (GPU names, nvidia-smi topo -m)
            facts = gpu_facts()
            wrong_gpu = gpu_type_mismatch(cfg.hardware.gpu_type, facts)
            if wrong_gpu:
                pf.need(False, wrong_gpu, local=True, dry_run=dry)
            link = interconnect_mismatch(cfg.hardware.interconnect, cfg.hardware.tp_size, facts)
            if link:
                pf.warnings.append(link)
    # Forced acceptance: real speed, outputs not lossless -- the record says so (results.PERFORMANCE_ONLY).
    if cfg.speculative and cfg.spec.simulate_accept_len is not None:
        pf.warnings.append(
            f"{PERFORMANCE_ONLY} (spec.simulate_accept_len={cfg.spec.simulate_accept_len}: "
            "every verify commits the forced count, SGLANG_SIMULATE_ACC_LEN)"
        )
    # A reported experiment from a dirty tree cannot be rebuilt from its commit.
    if cfg.name != "adhoc":
        if git_state(root).get("code_dirty"):
            pf.warnings.append(
                f"experiment={cfg.name} runs from a dirty git tree: commit first, or the "
                "result's git.commit does not rebuild it (its git.tree names the files: a commit whose tree it is does)"
            )
    eng = engine_of(cfg)
    pf.warnings.extend(eng.config_warnings(cfg, dict(os.environ)))  # dead flags, inherited switches
    if eng.external:
        pf.need(
            eng.installed_version() is not None,
            "engine=sglang: sglang is not installed; pip install -e '.[sglang]' on the GPU box",
            local=True,
            dry_run=dry,
        )
        # A release outside the engine's supported ones (engines.sglang.SUPPORTED): its flags, log lines
        # and hook targets are unchecked, so the job is refused.
        if (refusal := eng.version_error()) is not None:
            pf.need(False, refusal, local=True, dry_run=dry)
        if cfg.benchmark.profile and cfg.speculative and eng.installed_version() is not None:
            # First contact: our profiler must be installed and its hook targets must exist in this
            # sglang, or every phase number of the sweep would be missing.
            for item in doctor.static_checks(eng.name)[1:]:
                pf.need(
                    item.ok,
                    f"self-check: {item.name}: {item.detail}; what to do: {item.fix} "
                    "(or benchmark.profile=false to run without the phase profile)",
                    local=True,
                    dry_run=dry,
                )
    # The profiler under DP attention (issue 27): a request is served by one attention-DP rank while
    # the others run IDLE batches (skipped); the serving rank is not found per request yet, so the
    # job's profile (tp 0 of each replica) could be a rank that served nothing.
    pf.need(
        not (cfg.benchmark.profile and cfg.speculative and "--enable-dp-attention" in cfg.engine.extra_args),
        "engine.extra_args has --enable-dp-attention with benchmark.profile=true: the phase profile does "
        "not yet find the attention-DP rank that served each request, so its phases could be an idle "
        "rank's; use benchmark.profile=false for this job (or drop --enable-dp-attention)",
    )
    return pf


def _placement(pf: Preflight, b: BenchmarkConfig, hw: HardwareConfig, paired: bool, dry: bool) -> None:
    """Where the servers run on the CPU: concurrent pairing's two halves of our cores, benchmark.server_cpus
    (cores this job may use; not with parallel jobs nor concurrent pairing), benchmark.server_nice."""
    tp = hw.tp_size
    concurrent = paired and b.pairing == pairing.CONCURRENT
    if concurrent:  # the spec server and its baseline pinned to disjoint halves of our cores
        cores = pairing.usable_cores()
        need = 2 * (tp if hw.device == "cpu" else 1)
        pf.need(
            len(cores) >= need,
            f"benchmark.pairing=concurrent runs the spec and the baseline server at once, each pinned "
            f"to its own CPU cores: that needs {need} cores (2 x hardware.tp_size={tp} ranks on CPU), "
            f"but this job may use {len(cores)} ({cores}); use benchmark.pairing=interleaved "
            f"(or benchmark.paired=false)",
            local=True,
            dry_run=dry,
        )
    pinned = b.cpu_set()
    if pinned is not None:
        usable = pairing.usable_cores()
        pf.need(
            pinned <= set(usable),
            f"benchmark.server_cpus={b.server_cpus}: cores {sorted(pinned - set(usable))} are not "
            f"among the {len(usable)} this job may use ({pairing.describe_cores(usable)}); pick from those, or null",
            local=True,
            dry_run=dry,
        )
        pf.need(
            hw.parallel_jobs == 1,
            f"benchmark.server_cpus={b.server_cpus} with hardware.parallel_jobs="
            f"{hw.parallel_jobs}: the jobs that run at once would pin their servers to the same cores; "
            "run them one at a time (hardware.parallel_jobs=1) or leave benchmark.server_cpus=null",
            dry_run=dry,
        )
        pf.need(
            not concurrent,
            f"benchmark.server_cpus={b.server_cpus} with benchmark.pairing=concurrent: concurrent "
            "pairing pins each arm to its own half of the cores; use one or the other",
            dry_run=dry,
        )
    nice = b.server_nice
    if nice is not None:
        pf.need(
            pairing.autogroups_enabled(),
            f"benchmark.server_nice={nice}: needs Linux scheduler autogroups ({pairing.AUTOGROUP_SWITCH} = 1); "
            "leave benchmark.server_nice=null here",
            local=True,
            dry_run=dry,
        )
        pf.need(
            nice >= 0 or os.geteuid() == 0,
            f"benchmark.server_nice={nice}: a negative nice needs root (CAP_SYS_NICE); use a value >= 0 or null",
            local=True,
            dry_run=dry,
        )


def run(cfg: ExperimentConfig, root: Path) -> list[str]:
    """Raise PreflightError listing every error; return the warnings."""
    pf = check(cfg, root)
    if pf.errors:
        raise PreflightError("preflight failed:\n  - " + "\n  - ".join(pf.errors))
    return pf.warnings
