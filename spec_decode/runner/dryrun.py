"""``dry_run=true``: the server command line and extra environment a job would use; nothing launched.

A job that preflight would stop prints its errors and exits 2 (as the real run would, before any server);
in a sweep the other jobs go on, each such job writes ``WOULD_REFUSE`` (its reasons) into its dir, and
the sweep exits 2 (views.sweep): a script that checks a sweep before spending the GPUs reads the status."""

from __future__ import annotations

import shlex

from spec_decode.core.config import ExperimentConfig
from spec_decode.engines import server_command, server_extra_env
from spec_decode.runner import preflight
from spec_decode.runner.context import WOULD_REFUSE, JobContext


class WouldRefuse(preflight.PreflightError):
    """A dry-run job that preflight would stop (its errors are printed already)."""


def dry_run(cfg: ExperimentConfig, ctx: JobContext) -> None:
    """Print the server command line and extra environment; launch nothing. Raises WouldRefuse (after
    printing everything) when preflight would stop the job."""
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
    if (cpus := cfg.benchmark.server_cpus) is not None:
        print(f"# each server pinned to CPU cores {cpus}: its launcher at spawn, every thread of its tree once up")
    if cfg.baseline_strategy != "none":
        print(
            f"# + baseline ({cfg.baseline_strategy}): the same command without the --speculative-* flags, "
            + ("a server beside this one" if cfg.baseline_strategy == "paired" else "a separate job")
        )
    (ctx.out_dir / WOULD_REFUSE).unlink(missing_ok=True)  # an earlier dry run's, in a reused dir
    if pf.errors:
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        (ctx.out_dir / WOULD_REFUSE).write_text("".join(f"{e}\n" for e in pf.errors))
        raise WouldRefuse(f"dry run: preflight would stop this job ({len(pf.errors)} error(s) above)")
