"""run_job: one benchmark job, end to end (DESIGN §1).

    preflight -> [baseline arm] -> launch server(s) -> warmup -> /flush_cache -> timed runs
    -> collect (records, decode log, profile) -> results.json -> MLflow -> headline metric

results.json is written whatever happens (FINISHED, FAILED with the runs measured so far, KILLED on
Ctrl-C); MLflow and reports are views of it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import preflight, results
from .client import Client, ClientError
from .config import DrafterConfig, ExperimentConfig, config_hash, resolved_dict
from .engines import server_command, server_extra_env
from .parsers.profile import rank_files
from .server import PortTaken, ServerError, ServerProcess, choose_port
from .slots import SlotTimeout, allocate, pool_for


@dataclass
class JobContext:
    """Where a job writes and how it is named; built from Hydra's runtime by run.py (or by tests)."""

    out_dir: Path
    run_name: str
    root: Path = field(default_factory=Path.cwd)  # project root: relative paths resolve here
    sweep_dir: Path | None = None  # set in a multirun: baselines are shared across its jobs
    parent_run_id: str | None = None
    overrides: list[str] = field(default_factory=list)
    tracker: object | None = None  # spec_decode.tracking.Tracker, or None for no MLflow
    quiet: bool = False


class JobFailed(RuntimeError):
    """The job ran but did not finish; results.json holds what was measured."""


def _say(ctx: JobContext, msg: str) -> None:
    if not ctx.quiet:
        print(msg, file=sys.stderr, flush=True)


def dry_run(cfg: ExperimentConfig, ctx: JobContext) -> None:
    """Print the server command line and extra environment; launch nothing."""
    pf = preflight.check(cfg, ctx.root)
    argv = server_command(cfg, cfg.engine.port)
    env = server_extra_env(cfg, str(ctx.out_dir / "profile.jsonl") if cfg.benchmark.profile else None)
    print(f"# job: {ctx.run_name or '(defaults)'}")
    for w in pf.warnings:
        print(f"# warning: {w}")
    for e in pf.errors:
        print(f"# error (would stop this job): {e}")
    print("# server env (in addition to the inherited one, minus inherited NCCL_*):")
    for k, v in env.items():
        print(f"{k}={v}")
    print("# server command:")
    print(shlex.join(argv))
    if cfg.speculative and cfg.benchmark.baseline_arm:
        print("# + baseline arm: the same command without the --speculative-* flags")


def baseline_config(cfg: ExperimentConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, drafter=DrafterConfig(name="none", path=None, layer_ids=None))


def baseline_key(cfg: ExperimentConfig) -> str:
    """Jobs that share hardware, model, NCCL profile, engine and benchmark share one baseline."""
    data = resolved_dict(baseline_config(cfg))
    data.pop("spec", None)
    data.pop("name", None)
    data.pop("tracking", None)
    readable = f"hardware={cfg.hardware.name},model={cfg.model.name},nccl={cfg.nccl.name},engine={cfg.engine.name}"
    return f"{readable},{config_hash(data)[:8]}"


def ensure_baseline(cfg: ExperimentConfig, ctx: JobContext) -> dict | None:
    """The matching baseline's results: reused from this sweep when already measured, else measured
    now (its own server launch, its own MLflow run). Shared through files in the sweep dir, never
    through process state, so parallel launchers and sweeps in one process behave the same."""
    root = ctx.sweep_dir / "baselines" if ctx.sweep_dir else ctx.out_dir / "baseline"
    key = baseline_key(cfg)
    bdir = root / key if ctx.sweep_dir else root
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel job with the same key waits, then reuses
        existing = results.read(bdir)
        if existing and existing.get("status") == "FINISHED":
            return existing
        _say(ctx, f"[baseline] measuring the baseline for {key} -> {bdir}")
        bctx = dataclasses.replace(ctx, out_dir=bdir, run_name=f"baseline[{key.rsplit(',', 1)[0]}]",
                                   overrides=[])
        try:
            return measure(baseline_config(cfg), bctx, role="baseline")
        except JobFailed as e:  # the spec job still runs; it gets no speedup_vs_baseline
            _say(ctx, f"[baseline] {e}; continuing without a baseline")
            return None


def run_job(cfg: ExperimentConfig, ctx: JobContext) -> dict | None:
    """The whole job. Returns the results dict (None for a dry run). Raises PreflightError before any
    launch for bad input, JobFailed when the job ran and failed (results.json is written)."""
    if cfg.dry_run:
        dry_run(cfg, ctx)
        return None
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    warnings = preflight.run(cfg, ctx.root)  # also covers the baseline: same target, prompts, GPUs
    probe = run_nccl_probe(cfg, ctx) if cfg.preflight.nccl_probe else None
    baseline = None
    if cfg.speculative and cfg.benchmark.baseline_arm:
        baseline = ensure_baseline(cfg, ctx)
    return measure(cfg, ctx, role="spec" if cfg.speculative else "baseline", baseline=baseline,
                   warnings=warnings, probe=probe)


def run_nccl_probe(cfg: ExperimentConfig, ctx: JobContext) -> dict:
    """All-reduce latency under the job's NCCL profile, at the standard sizes and the model's decode
    size (hidden x batch 1 x dtype bytes); gloo with 2 processes on CPU profiles."""
    from .nccl_probe import DEFAULT_SIZES, decode_bytes, probe

    cuda = cfg.hardware.device == "cuda"
    sizes = list(DEFAULT_SIZES)
    if (n := decode_bytes(_abs(ctx.root, cfg.model.path))) is not None:
        sizes.append(n)  # hidden x the checkpoint's dtype (the tiny target is fp32)
    world = cfg.hardware.tp_size if cuda else max(2, cfg.hardware.tp_size)  # the server's ranks
    _say(ctx, f"[nccl probe] {'nccl' if cuda else 'gloo'} x{world}, nccl={cfg.nccl.name}, sizes {sorted(set(sizes))}")
    return probe(world, "nccl" if cuda else "gloo", sizes, iters=cfg.preflight.nccl_probe_iters,
                 env=dict(cfg.nccl.env))


def measure(cfg: ExperimentConfig, ctx: JobContext, role: str, baseline: dict | None = None,
            warnings: list[str] | None = None, probe: dict | None = None) -> dict:
    """Launch, run the protocol, collect; results.json whatever happens."""
    warnings = list(warnings or [])
    out = ctx.out_dir
    out.mkdir(parents=True, exist_ok=True)
    profile_path = out / "profile.jsonl"
    log_path = out / "server.log"
    for stale in (profile_path, log_path, *rank_files(profile_path).values()):
        stale.unlink(missing_ok=True)
    prompt = preflight.load_prompts(_abs(ctx.root, cfg.benchmark.prompts))[cfg.benchmark.prompt_index]
    extra_env = server_extra_env(cfg, str(profile_path) if cfg.benchmark.profile else None)
    rec = results.new_record(cfg, ctx, role, extra_env, warnings)
    if probe is not None:
        rec["nccl_probe"] = probe
    tracked = ctx.tracker.start(rec, ctx) if ctx.tracker is not None else None
    log_windows: list[tuple[int, int]] = []
    status, error = "FINISHED", None
    pool, slots, need = pool_for(cfg.hardware)
    try:
        with allocate(pool, slots, need, Path(cfg.hardware.slots_dir)) as mine:
            rec["slots"] = mine
            if cfg.hardware.device == "cuda":
                extra_env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
            for launch in range(cfg.benchmark.launches):
                _one_launch(cfg, ctx, launch, prompt, extra_env, rec, log_path, log_windows)
    except KeyboardInterrupt:
        status, error = "KILLED", "interrupted (Ctrl-C / SIGINT)"
        raise
    except (ServerError, ClientError, OSError, SlotTimeout) as e:
        status, error = "FAILED", f"{type(e).__name__}: {e}"
    finally:
        results.finish(rec, cfg, status, error, out, log_path, log_windows, baseline)
        results.write(out, rec)
        if ctx.tracker is not None:
            ctx.tracker.finish(tracked, rec, out)
            results.write(out, rec)  # with the MLflow outcome (run id or the unreachable warning)
        _say(ctx, results.job_summary(rec))
    if status != "FINISHED":
        raise JobFailed(f"job {ctx.run_name or out.name} {status}: {error}")
    return rec


def _abs(root: Path, p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else root / path


def _start_server(cfg: ExperimentConfig, extra_env: dict[str, str], log_path: Path,
                  attempts: int = 3) -> ServerProcess:
    """Start the server on the configured port, or a free one when it is taken (also when another
    sweep takes it between our check and the server's bind)."""
    wanted = cfg.engine.port
    for attempt in range(attempts):
        port = choose_port(cfg.engine.host, wanted if attempt == 0 else 0)
        srv = ServerProcess(server_command(cfg, port), env=extra_env, log_path=log_path,
                            host=cfg.engine.host, port=port, startup_timeout_s=cfg.engine.startup_timeout_s)
        try:
            return srv.start()
        except PortTaken:
            continue
    raise ServerError(f"could not get a free port for the server after {attempts} attempts")


def _self_check(rec: dict, cfg: ExperimentConfig, warmup, log_path: Path, log_start: int) -> None:
    """The doctor's live items on the warmup request: profile lines from rank 0 with every phase,
    meta_info counters, decode-log lines. A failure is a warning (the job still measures)."""
    from . import doctor

    items = doctor.warmup_checks(rec, warmup, log_path.parent / "profile.jsonl", log_path, log_start,
                                 cfg.speculative)
    rec["doctor"] = doctor.as_records(items)
    for it in items:
        if not it.ok:
            rec["warnings"].append(f"self-check failed: {it.name}: {it.detail}"
                                   + (f" -- what to do: {it.fix}" if it.fix else ""))


def _one_launch(cfg: ExperimentConfig, ctx: JobContext, launch: int, prompt: str,
                extra_env: dict[str, str], rec: dict, log_path: Path,
                log_windows: list[tuple[int, int]]) -> None:
    from tqdm import tqdm

    srv = _start_server(cfg, extra_env, log_path)
    port = srv.port
    rec.setdefault("argv", srv.argv)
    b = cfg.benchmark
    with srv:
        client = Client(srv.base_url, cfg.engine.request_timeout_s)
        rec["launches"].append({"launch": launch, "port": port, "pid": srv.pid,
                                "server_start_s": srv.start_s})
        if launch == 0:
            rec["server_env_live"] = srv.environ()  # filtered + redacted in results.finish
            rec["server_env_tree_live"] = srv.environ_tree()
        body = client.generate_body(prompt, b.max_new_tokens, b.temperature, b.ignore_eos)
        name = ctx.run_name or "job"
        label = f"{name if len(name) <= 48 else name[:45] + '...'} [{launch + 1}/{b.launches}]"
        # disable=None: no bar when stderr is not a terminal (SLURM/CI logs stay readable)
        bar = tqdm(total=b.warmup + b.runs, desc=label, unit="run", disable=True if ctx.quiet else None,
                   file=sys.stderr, leave=False)
        try:
            log_start = log_path.stat().st_size
            for _ in range(b.warmup):
                w = client.generate(body, launch, -1)
                rec["launches"][-1]["warmup_s"] = rec["launches"][-1].get("warmup_s", 0.0) + w.wall_s
                bar.update()
            if launch == 0 and b.warmup and b.profile:
                _self_check(rec, cfg, w, log_path, log_start)
            client.flush_cache()
            start = log_path.stat().st_size
            for run in range(b.runs):
                record = client.generate(body, launch, run)
                rec["runs"].append(record.as_dict())
                bar.set_postfix(tok_s=f"{record.throughput_tok_s:.1f}")
                bar.update()
                srv.check_alive()
            time.sleep(0.05)  # let the last decode-log line reach the file
            log_windows.append((start, log_path.stat().st_size))
            rec["server_info"] = client.server_info()
        finally:
            bar.close()


