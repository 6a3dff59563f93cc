"""The wiring between Hydra's runtime and run_job (kept out of run.py so tests can call it).

It sits above the floors, beside run.py and ``__main__``: it opens the MLflow view (``views.tracking``) for
the job that ``runner`` measures, so it belongs to neither."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from spec_decode.core.config import ConfigError, config_hash, to_experiment
from spec_decode.core.overrides import check_composed
from spec_decode.record import results
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner import interrupt
from spec_decode.runner.context import AXES_ENV, STARTED_ENV, JobContext
from spec_decode.runner.dryrun import WouldRefuse
from spec_decode.runner.job import JobFailed, run_job
from spec_decode.runner.preflight import PreflightError
from spec_decode.views.tracking import PARENT_ENV, Tracker


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a SLURM time limit, kill): handled like Ctrl-C -- the server tree is killed and
    the run ends KILLED. Without it submitit ignores SIGTERM in a SLURM job until SIGKILL comes, which
    leaves the run RUNNING and the submitting process waiting for a result that never comes."""


def _on_sigterm(signum, frame) -> None:
    interrupt.mark(signum)
    raise Terminated("terminated by SIGTERM (scancel, time limit or kill)")


def run_from_hydra(cfg: DictConfig) -> float | None:
    interrupt.started()  # a job: from here on a Ctrl-C cleans up (before it, Hydra composing: exit at once)
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        check_composed(cfg)  # a '+key' from a sweeper's params or an experiment file
        exp = to_experiment(cfg)
    except ConfigError as e:
        with ConsoleLog(Path(hc.runtime.output_dir) / "run.log"):  # the job dir says why it holds no results
            print(f"error: {e}", file=sys.stderr)
        if multirun:  # one bad cell (spec.steps=0 in spec.steps=0,2): its FAILED record; the sweep goes on
            record_config_error(cfg, hc, str(e))
            return None
        raise SystemExit(2) from None
    if not multirun and hc.sweeper.get("params"):  # Hydra would run one job at the defaults, silently
        axes = " ".join(f"{k}={v}" for k, v in hc.sweeper.params.items())
        with ConsoleLog(Path(hc.runtime.output_dir) / "run.log"):
            print(
                f"error: experiment={exp.name} defines a sweep ({axes}); without -m only one job at the defaults "
                f"would run. Run the sweep: python run.py -m experiment={exp.name}  (one point: add its value, "
                f"e.g. -m experiment={exp.name} {next(iter(hc.sweeper.params))}=...)",
                file=sys.stderr,
            )
        raise SystemExit(2)
    root = Path(hc.runtime.cwd)
    ctx = JobContext(
        out_dir=Path(hc.runtime.output_dir),
        run_name=hc.job.override_dirname,
        root=root,
        sweep_dir=Path(hc.sweep.dir).resolve() if multirun else None,
        parent_run_id=os.environ.get(PARENT_ENV) if multirun else None,
        overrides=list(hc.overrides.task),
        tracker=None if exp.dry_run else Tracker.from_config(exp.tracking, root),
        sweep_axes=[a for a in os.environ.get(AXES_ENV, "").split(",") if a] if multirun else [],
        sweep_started=float(os.environ.get(STARTED_ENV) or 0) if multirun else 0.0,
    )
    if multirun and exp.fail_fast and ctx.sweep_dir and (ctx.sweep_dir / "FAILED").exists():
        print(f"skipping {ctx.run_name}: an earlier job failed and fail_fast=true", file=sys.stderr)
        return None
    signal.signal(signal.SIGTERM, _on_sigterm)  # overrides submitit's "bypass" handler in SLURM jobs
    with ConsoleLog(ctx.out_dir / "run.log"):
        return _run(exp, ctx, multirun)


def record_config_error(cfg: DictConfig, hc, error: str) -> JobRecord:
    """A sweep's job whose values break a rule of the typed config: a FAILED record naming the key (refused
    "config"), in its job dir and as its MLflow run, so the summary counts it and the sweep exits 2."""
    try:
        conf = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve: keep it as written
        conf = OmegaConf.to_container(cfg, resolve=False)
    rec = JobRecord(
        role="spec" if OmegaConf.select(cfg, "drafter.path") is not None else "baseline",
        name=hc.job.override_dirname,
        experiment=str(cfg.get("name", "adhoc")),
        config=conf,
        config_hash=config_hash(conf),
        engine=EngineInfo(str(OmegaConf.select(cfg, "engine.name"))),
        speculative=OmegaConf.select(cfg, "drafter.path") is not None,
        status="FAILED",
        error=f"config error: {error}",
        refused="config",
        overrides=list(hc.overrides.task),
        out_dir=str(Path(hc.runtime.output_dir)),
        ended_at=time.time(),
    )
    ctx = JobContext(
        out_dir=Path(hc.runtime.output_dir),
        run_name=rec.name,
        root=Path(hc.runtime.cwd),
        sweep_dir=Path(hc.sweep.dir).resolve(),
        parent_run_id=os.environ.get(PARENT_ENV),
        overrides=rec.overrides,
    )
    tracker = None
    with contextlib.suppress(Exception):  # a tracking group that does not compose either: results.json only
        tracker = Tracker.from_config(cfg.tracking, ctx.root)
    run_id = tracker.start(rec, ctx) if tracker is not None else None
    results.write(ctx.out_dir, rec)
    if tracker is not None:
        tracker.finish(run_id, rec, ctx.out_dir)
    _mark_failed(ctx, bool(cfg.get("fail_fast", False)))
    return rec


def _run(exp, ctx: JobContext, multirun: bool) -> float | None:
    try:
        rec = run_job(exp, ctx)
    except Terminated as e:
        _mark_failed(ctx, exp.fail_fast)
        print(f"error: job {ctx.run_name or ctx.out_dir.name} KILLED: {e}", file=sys.stderr)
        if multirun and os.environ.get("SUBMITIT_EXECUTOR"):
            return None  # one cluster job of the sweep: submitit gets a result, the other jobs go on
        raise
    except WouldRefuse as e:  # a dry run: nothing recorded, nothing to skip (fail_fast), the sweep exits 2
        print(f"error: {e}", file=sys.stderr)
        if multirun:
            return None
        raise SystemExit(2) from None
    except PreflightError as e:  # run_job wrote the job's FAILED record: the sweep summary counts it
        print(f"error: {e}", file=sys.stderr)
        _mark_failed(ctx, exp.fail_fast)
        if multirun:
            return None
        raise SystemExit(2) from None
    except JobFailed as e:
        _mark_failed(ctx, exp.fail_fast)
        if multirun:  # the sweep goes on; its summary and parent run list the failure
            print(f"error: {e}", file=sys.stderr)
            return None
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if rec is None:
        return None
    return rec.metrics.get("throughput_tok_s")


class ConsoleLog:
    """While a job runs, what it prints (stdout and stderr) also goes to ``run.log`` in its job dir;
    progress-bar redraws (carriage returns) stay on the terminal only."""

    class _Tee:
        def __init__(self, stream, log):
            self.stream, self.log = stream, log

        def write(self, text: str) -> int:
            if "\r" not in text:
                self.log.write(text)
                self.log.flush()
            return self.stream.write(text)

        def flush(self) -> None:
            self.stream.flush()

        def __getattr__(self, name):  # isatty, fileno, encoding ... of the real stream
            return getattr(self.stream, name)

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> ConsoleLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.path, "a", encoding="utf-8")
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self._Tee(sys.stdout, self.log), self._Tee(sys.stderr, self.log)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout, sys.stderr = self.saved
        self.log.close()


def _mark_failed(ctx: JobContext, fail_fast: bool) -> None:
    if fail_fast and ctx.sweep_dir is not None:
        (ctx.sweep_dir / "FAILED").write_text(ctx.run_name + "\n")
