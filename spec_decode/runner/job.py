"""run_job: one benchmark job, end to end (DESIGN §1).

    preflight -> [baseline arm] -> launch server(s) -> warmup -> /flush_cache -> timed runs (streamed)
    -> [request pass: one request per prompt of benchmark.request_prompts, outputs.jsonl]
    -> finish (aggregates, latency, profile, decode log, speedup, checks, lossless guard) -> drift guard
    -> results.json (written once) -> MLflow (a view of it) -> headline metric

results.json is written whatever happens (FAILED naming the key when preflight refuses the job,
FAILED with the runs measured so far, KILLED on Ctrl-C); MLflow and reports only read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from spec_decode.analysis.finish import Measured, add_drift, finish, measures_baseline
from spec_decode.analysis.load import finish as load_finish
from spec_decode.core.config import ExperimentConfig
from spec_decode.core.lineage import lineage_tags
from spec_decode.core.prompts import load_prompts
from spec_decode.engines import rank_nccl_env, server_extra_env, start_server
from spec_decode.engines.engine import engine_of
from spec_decode.engines.server_process import ServerError
from spec_decode.parsers.profile import rank_files
from spec_decode.probe.nccl import DEFAULT_SIZES, decode_bytes, probe
from spec_decode.record import outputs, results
from spec_decode.record.measured import Launch
from spec_decode.record.payloads import NcclProbe, nccl_probe_from, server_info_from
from spec_decode.record.results import JobRecord
from spec_decode.runner import (
    dryrun,
    load,
    machine,
    pairing,
    preflight,
    profile_pass,
    progress,
    request_pass,
)
from spec_decode.runner.baselines import abs_path, baseline_config, baseline_key, baseline_name, earlier_baselines
from spec_decode.runner.client import Client, ClientError
from spec_decode.runner.context import JobContext, new_record
from spec_decode.runner.slots import SlotTimeout, allocate, pool_for
from spec_decode.runner.summary import job_summary

__all__ = ["JobContext", "JobFailed", "run_job", "measure"]


class JobFailed(RuntimeError):
    """The job ran but did not finish; results.json holds what was measured."""


def _say(ctx: JobContext, msg: str) -> None:
    if not ctx.quiet:
        print(msg, file=sys.stderr, flush=True)


def ensure_baseline(cfg: ExperimentConfig, ctx: JobContext) -> JobRecord | None:
    """The matching baseline's results: reused from this sweep when already measured, else measured
    now (its own server launch, its own MLflow run). Shared through files in the sweep dir, never
    through process state, so parallel launchers and sweeps in one process behave the same."""
    root = ctx.sweep_dir / "baselines" if ctx.sweep_dir else ctx.out_dir / "baseline"
    key = baseline_key(cfg)
    bdir = root / key if ctx.sweep_dir else root
    bdir.mkdir(parents=True, exist_ok=True)
    with FileLock(bdir / ".lock"):  # a parallel job with the same key waits, then reuses
        existing = results.read(bdir)
        if existing and existing.status == "FINISHED":
            return existing
        if failed_in_this_sweep(existing, ctx):  # one try per key and sweep: a launch
            # can take half an hour (Kimi at tp 8), and what failed it (weights, memory, flags) fails it again
            why = (existing.error or "no error recorded").splitlines()[0][:300]
            _say(
                ctx,
                f"[baseline] the shared baseline {key} FAILED earlier in this sweep ({why}; its run.log and "
                f"server.log in {bdir}); not launched again: continuing without a baseline",
            )
            return None
        _say(ctx, f"[baseline] measuring the baseline for {key} -> {bdir}")
        name = baseline_name(ctx.run_name)
        bctx = dataclasses.replace(ctx, out_dir=bdir, run_name=name, overrides=name.split(",")[1:])
        try:
            return measure(baseline_config(cfg), bctx, role="baseline")
        except JobFailed as e:  # the spec job still runs; it gets no speedup_vs_baseline
            _say(ctx, f"[baseline] {e}; continuing without a baseline")
            return None


def failed_in_this_sweep(rec: JobRecord | None, ctx: JobContext) -> bool:
    """A shared baseline that FAILED in this sweep (not in an earlier one whose dir this sweep reuses: that
    one is tried again, its cause perhaps fixed)."""
    return bool(  # sweep_started is set in a sweep alone
        rec is not None and rec.status == "FAILED" and ctx.sweep_started and (rec.ended_at or 0) >= ctx.sweep_started
    )


def run_job(cfg: ExperimentConfig, ctx: JobContext) -> JobRecord | None:
    """The whole job. Returns its record (None for a dry run). Raises PreflightError before any
    launch for bad input (a FAILED results.json names the key; in a dry run dryrun.WouldRefuse, no record),
    JobFailed when the job ran and failed (results.json holds what was measured)."""
    if cfg.dry_run:
        dryrun.dry_run(cfg, ctx)
        return None
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        warnings = preflight.run(cfg, ctx.root)  # also covers the baseline: same target, prompts, GPUs
    except preflight.PreflightError as e:
        record_refusal(cfg, ctx, str(e))
        raise
    probe = run_nccl_probe(cfg, ctx) if cfg.preflight.nccl_probe else None
    # One baseline strategy per job (cfg.baseline_strategy): a paired server beside the spec server
    # (measure), or a separate baseline job measured here -- never both.
    baseline = ensure_baseline(cfg, ctx) if cfg.baseline_strategy == "job" else None
    return measure(
        cfg, ctx, role="spec" if cfg.speculative else "baseline", baseline=baseline, warnings=warnings, probe=probe
    )


def record_refusal(cfg: ExperimentConfig, ctx: JobContext, error: str) -> JobRecord:
    """A job that preflight refused still leaves its FAILED record (and MLflow run), so sweep
    summaries and the parent run count it."""
    rec = new_record(cfg, ctx, "spec" if cfg.speculative else "baseline", {}, [])
    rec.status, rec.error, rec.ended_at, rec.refused = "FAILED", error, time.time(), "preflight"
    tracked = ctx.tracker.start(rec, ctx) if ctx.tracker is not None else None
    results.write(ctx.out_dir, rec)
    if ctx.tracker is not None:
        ctx.tracker.finish(tracked, rec, ctx.out_dir)
    return rec


def run_nccl_probe(cfg: ExperimentConfig, ctx: JobContext) -> NcclProbe:
    """All-reduce latency under the job's NCCL profile, at the standard sizes and the model's decode
    size (hidden x batch 1 x dtype bytes); gloo with 2 processes on CPU profiles."""
    cuda = cfg.hardware.device == "cuda"
    sizes = list(DEFAULT_SIZES)
    if (n := decode_bytes(abs_path(ctx.root, cfg.model.path))) is not None:
        sizes.append(n)  # hidden x the checkpoint's dtype (the tiny target is fp32)
    world = cfg.hardware.tp_size if cuda else max(2, cfg.hardware.tp_size)  # the server's ranks
    _say(ctx, f"[nccl probe] {'nccl' if cuda else 'gloo'} x{world}, nccl={cfg.nccl.name}, sizes {sorted(set(sizes))}")
    result = probe(
        world, "nccl" if cuda else "gloo", sizes, iters=cfg.preflight.nccl_probe_iters, env=rank_nccl_env(cfg)
    )  # the ranks' NCCL variables: the profile + the engine launcher's
    return nccl_probe_from(result)


def measure(
    cfg: ExperimentConfig,
    ctx: JobContext,
    role: str,
    baseline: JobRecord | None = None,
    warnings: list[str] | None = None,
    probe: NcclProbe | None = None,
) -> JobRecord:
    """Launch, run the protocol, collect; results.json whatever happens."""
    warnings = list(warnings or [])
    out = ctx.out_dir
    out.mkdir(parents=True, exist_ok=True)
    profile_path = out / "profile.jsonl"
    log_path = out / "server.log"
    for stale in (
        profile_path,
        log_path,
        out / outputs.FILE,
        out / outputs.PAIRED_FILE,
        *rank_files(profile_path).values(),
    ):
        stale.unlink(missing_ok=True)
    prompt = load_prompts(abs_path(ctx.root, cfg.benchmark.prompts))[cfg.benchmark.prompt_index]
    extra_env = server_extra_env(cfg, str(profile_path) if cfg.benchmark.profile else None)
    rec = new_record(cfg, ctx, role, extra_env, warnings)
    rec.nccl_probe = probe
    if cfg.speculative:  # one click from a throughput number to the data its drafter learned from
        rec.provenance.drafter_lineage = _drafter_lineage(cfg.drafter.path, ctx)
    tracked = ctx.tracker.start(rec, ctx) if ctx.tracker is not None else None
    measured = Measured(out, log_path)  # log windows, the first launch's live server env
    status, error = "FINISHED", None
    pool, slots, need = pool_for(cfg.hardware)
    pair = None
    if role == "spec" and cfg.paired:
        # The baseline server beside ours: same flags minus speculation, no profiler, its own log.
        pair = Pair(baseline_config(cfg), server_extra_env(baseline_config(cfg), None), out / "baseline.server.log")
        pair.log_path.unlink(missing_ok=True)
        if cfg.hardware.device == "cuda":
            need *= 2  # disjoint GPUs for the two servers (the slot allocator never shares one)
    try:
        with allocate(pool, slots, need, Path(cfg.hardware.slots_dir)) as mine:
            rec.slots = mine
            if cfg.hardware.device == "cuda":
                extra_env["CUDA_VISIBLE_DEVICES"] = ",".join(mine[: cfg.hardware.tp_size])
                if pair is not None:
                    pair.env["CUDA_VISIBLE_DEVICES"] = ",".join(mine[cfg.hardware.tp_size :])
            for launch in range(cfg.benchmark.launches):
                _one_launch(cfg, ctx, launch, prompt, extra_env, rec, measured, pair)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (hydra_entry.Terminated: scancel, time limit, kill)
        status, error = "KILLED", str(e) or "interrupted (Ctrl-C / SIGINT)"
        raise
    except (ServerError, ClientError, OSError, SlotTimeout) as e:
        status, error = "FAILED", f"{type(e).__name__}: {e}"
    except Exception as e:  # anything else (a bug, submitit's pre-timeout error): not FINISHED
        status, error = "FAILED", f"{type(e).__name__}: {e}"
        raise
    finally:
        engine = engine_of(cfg)
        finish(rec, cfg, status, error, measured, baseline, engine)  # analysis/finish.py
        load_lines = (
            load_finish(rec, cfg.benchmark, baseline, log_path, pair.log_path if pair else None, engine.exact_outputs)
            if cfg.benchmark.under_load
            else []
        )  # benchmark.concurrency / request_rate (issue 28)
        if measures_baseline(rec) is not None:  # a baseline job, or a paired job's baseline arm
            add_drift(rec, earlier_baselines(cfg.tracking.results_dirs, cfg.nccl.name, ctx, rec))
        results.write(out, rec)  # the one write
        if ctx.tracker is not None:
            ctx.tracker.finish(tracked, rec, out)  # a view: logs the record as written
        _say(ctx, "\n".join([job_summary(rec), *load_lines]))
        _say(ctx, where_to_look(rec, ctx))
    if status != "FINISHED":
        raise JobFailed(f"job {ctx.run_name or out.name} {status}: {error}")
    return rec


def where_to_look(rec: JobRecord, ctx: JobContext) -> str:
    """The lines that end a job: its directory, its MLflow run and how to open it, the report."""
    lines = [f"  results: {ctx.out_dir} (results.json, run.log, server.log)"]
    if rec.mlflow_run_id and ctx.tracker is not None:
        try:
            lines.append(
                f"  MLflow run {rec.mlflow_run_id}: {ctx.tracker.ui_command()}, then "
                f"{ctx.tracker.ui_url(rec.mlflow_run_id)}"
            )
        except Exception:  # noqa: BLE001 - a store gone since the run was logged: the id still helps
            lines.append(f"  MLflow run {rec.mlflow_run_id}")
    if not ctx.sweep_dir:
        lines.append(f"  report: python -m spec_decode.views.report {ctx.out_dir}")
    return "\n".join(lines)


def _drafter_lineage(path: str | None, ctx: JobContext) -> dict[str, str]:
    """The drafter's lineage tags; its training run is looked up in the job's own store, and only
    when that store answers (MLflow's client retries a dead server for minutes)."""
    uri = "off"
    if ctx.tracker is not None:
        try:
            ctx.tracker.reachable()
            uri = ctx.tracker.uri
        except ConnectionError:
            pass
    return lineage_tags(abs_path(ctx.root, str(path)), uri)


@dataclass
class Pair:
    """The paired baseline server of a spec job (benchmark.paired)."""

    cfg: ExperimentConfig
    env: dict[str, str]
    log_path: Path


def _one_launch(
    cfg: ExperimentConfig,
    ctx: JobContext,
    launch: int,
    prompt: str,
    extra_env: dict[str, str],
    rec: JobRecord,
    measured: Measured,
    pair: Pair | None = None,
) -> None:
    """One server launch: warmup, /flush_cache, the timed runs. With ``pair``, the baseline server runs
    beside ours and each timed run is paired with one of its own (benchmark.pairing: interleaved or
    concurrent, see spec_decode/runner/pairing.py)."""
    b, log_path = cfg.benchmark, measured.log_path
    nice, cores = b.server_nice, b.cpu_set()
    name = ctx.run_name or "job"
    label = f"{name if len(name) <= 48 else name[:45] + '...'} [{launch + 1}/{b.launches}]"
    arms = 2 if pair is not None else 1
    bar = progress.job_bar(label, arms * (b.warmup + b.runs), ctx.quiet)
    progress.phase(bar, label, "starting server (loading weights)")
    profile_pass.arm(extra_env)
    try:
        srv = start_server(cfg, extra_env, log_path, cpus=cores)
    except BaseException:
        bar.close()
        raise
    port = srv.port
    rec.argv = rec.argv or srv.argv
    with contextlib.ExitStack() as stack:
        stack.enter_context(srv)
        client = Client(srv.base_url, cfg.engine.request_timeout_s)
        this = Launch(launch, port, srv.pid, srv.start_s)
        rec.launches.append(this)
        if nice is not None:  # benchmark.server_nice, read back from the server
            pairing.set_group_nice(srv.pid, nice)
            this.server_nice = pairing.group_nice(srv.pid)
        if cores is not None:  # benchmark.server_cpus, read back from the kernel
            pairing.pin_tree(srv.pid, cores)
            this.server_cpus = pairing.tree_affinity(srv.pid)
        bclient = None
        if pair is not None:
            bsrv = stack.enter_context(start_server(pair.cfg, pair.env, pair.log_path, any_port=True, cpus=cores))
            bclient = Client(bsrv.base_url, cfg.engine.request_timeout_s)
            this.baseline_port, this.baseline_pid = bsrv.port, bsrv.pid
            this.baseline_server_start_s, this.pairing = bsrv.start_s, b.pairing
            if nice is not None:
                pairing.set_group_nice(bsrv.pid, nice)
                this.baseline_server_nice = pairing.group_nice(bsrv.pid)
            if cores is not None:
                pairing.pin_tree(bsrv.pid, cores)
                this.baseline_server_cpus = pairing.tree_affinity(bsrv.pid)
            pairer = pairing.Pairer(b.pairing, srv.pid, bsrv.pid)  # concurrent: pins both trees now
        if launch == 0:
            measured.live_env.update(srv.environ())  # filtered + redacted in analysis.finish
            measured.live_env_tree.update(srv.environ_tree())
        body = client.generate_body(prompt, b.max_new_tokens, b.temperature, b.ignore_eos)
        gen = functools.partial(client.generate, body)  # one timed run: one request, or a load (issue 28)
        bgen = functools.partial(bclient.generate, body) if bclient is not None else None
        if b.under_load:
            gen = load.LoadRunner(b, ctx.root, client, rec, load.SELF, log_path)
            bgen = load.LoadRunner(b, ctx.root, bclient, rec, load.PAIRED, pair.log_path) if bclient else None
        try:
            log_start = log_path.stat().st_size
            progress.phase(bar, label, "warmup")
            for _ in range(b.warmup):  # streamed like the timed runs: the same code path warmed
                w = client.generate(body, launch, -1, stream=b.stream)
                this.warmup_s = (this.warmup_s or 0.0) + w.wall_s
                bar.update()
                if bclient is not None:
                    bw = bclient.generate(body, launch, -1, stream=b.stream)
                    pairer.expected_s = {"spec": w.wall_s, "base": bw.wall_s}  # pair 0's start delays
                    bar.update()
            profile_pass.after_warmup(
                rec, b, cfg.speculative, w if b.warmup else None, log_path, log_start, launch, extra_env
            )
            if b.under_load:  # each load prompt alone (bs 1): warms, and every request must equal it
                gen.reference(launch)
                if bclient is not None:
                    bgen.reference(launch)
            client.flush_cache()
            if bclient is not None:
                bclient.flush_cache()
            start, host_t0 = log_path.stat().st_size, machine.sample()  # + load/steal over the timed runs
            procs_t0 = [machine.tree_sample(srv.pid), machine.tree_sample(this.baseline_pid)]
            for run in range(b.runs):
                progress.phase(bar, label, f"run {run + 1}/{b.runs}", [r.throughput_tok_s for r in rec.runs])
                if bclient is None:
                    rec.runs.append(gen(launch, run, stream=b.stream))
                    srv.check_alive()
                    bar.update()
                    continue
                spec_run, base_run, info = pairer.run(
                    run,
                    functools.partial(gen, launch, run, stream=b.stream),
                    functools.partial(bgen, launch, run, stream=b.stream),
                )
                rec.runs.append(spec_run)
                rec.baseline_runs.append(base_run)
                this.pairs = this.pairs or []
                this.pairs.append(info)
                srv.check_alive()
                bsrv.check_alive()
                bar.update(2)
            time.sleep(0.05)  # let the last decode-log line reach the file
            procs_t1 = [machine.tree_sample(srv.pid), machine.tree_sample(this.baseline_pid)]
            this.host = machine.window(host_t0, machine.sample())
            this.host.server_procs = machine.tree_window(procs_t0[0], procs_t1[0])
            this.host.procs_s = round(procs_t1[0]["t"] - procs_t0[0]["t"], 3)
            if bclient is not None:
                this.host.baseline_procs = machine.tree_window(procs_t0[1], procs_t1[1])
            measured.log_windows.append((start, log_path.stat().st_size))
            profile_pass.run(b, gen, rec, launch, extra_env, srv.check_alive)
            rec.server_info = server_info_from(client.server_info())
            if b.request_pass and launch == b.launches - 1:
                prompts_path = abs_path(ctx.root, b.request_prompts)
                rec.requests += request_pass.run(
                    b, prompts_path, client, launch, log_path.parent, outputs.FILE, ctx.quiet
                )
                if bclient is not None:  # the paired server's outputs: the lossless guard's reference
                    request_pass.run(b, prompts_path, bclient, launch, log_path.parent, outputs.PAIRED_FILE, ctx.quiet)
        finally:
            bar.close()
