"""The sweep's Hydra callback: the MLflow parent run of a multirun and the sweep summary.

``on_multirun_start`` opens the parent run and hands its id to each job (environment, so it also
reaches submitit/joblib workers); at the end (also on failure or Ctrl-C, via atexit) the summary table
and plots are rendered from the jobs' results.json files -- preflight-refused jobs included --, the
step recommendation (spec_decode.analysis.recommend) goes on the parent as the tag ``recommendation`` and the
artifact ``recommendation.json``, and the parent closes FINISHED, FAILED (any job not FINISHED, or no job at all) or KILLED.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import (
    BasicSweeper,  # its own split: the jobs it will launch
)
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from spec_decode.record import results
from spec_decode.runner import interrupt, progress
from spec_decode.runner.context import AXES_ENV, STARTED_ENV, WOULD_REFUSE
from spec_decode.views.tracking import PARENT_ENV, Tracker, experiment_tags

# Hydra builds this callback in every run.py, a single job too: what only the summary needs (tabulate, the
# report, the plots, the A/A control, the step recommendation: scipy, ~0.3 s of CPU) is imported where it is
# used, so that a run.py stopping at a config error, in preflight or at a dry run does not pay for it.


@functools.cache
def _summary_modules():
    """What only the summary needs (the note after the imports), imported once a sweep starts: a single
    job never pays for it, and a Ctrl-C that lands in the middle of an import (numpy half-initialised)
    cannot leave the summary to import it again at exit (a traceback there, test_interrupt.py)."""
    # lazy: start-up cost of every run.py (the docstring above)
    from spec_decode.analysis import blocks, control, recommend
    from spec_decode.views.mlflow_run import log_acceptance_plots
    from spec_decode.views.plots import write_plots
    from spec_decode.views.report import sweep_summary

    return blocks, control, recommend, log_acceptance_plots, write_plots, sweep_summary


def markdown_summary(table: dict[str, list], sweep_dir: str) -> str:
    from tabulate import tabulate  # lazy: start-up cost of every run.py (the note after the imports)

    cols = list(table)
    rows = [[table[c][i] for c in cols] for i in range(len(table[cols[0]]) if cols else 0)]
    return (
        f"Sweep `{sweep_dir}`\n\n"
        + tabulate(rows, headers=cols, tablefmt="github", disable_numparse=True)
        + "\n\nPlots: Artifacts > plots. Per job: its child run (results.json, server.log, profile/)."
    )


PARTIAL = "partial sweep"  # what a recommendation from a sweep that did not run every planned job says first


def where_to_look(sweep_dir: str, parent_run_id: str | None, tracker: Tracker | None, jobs: int = 1) -> str:
    """The lines that end a sweep: where its files are, its MLflow parent run, what to run next (``jobs``:
    how many records it wrote; with none, e.g. a dry run, there is nothing to report)."""
    files = (
        "sweep_summary.txt, plots, one dir per job with results.json and run.log"
        if jobs
        else "sweep_summary.txt, one dir per job with its run.log"
    )
    lines = [f"sweep dir: {sweep_dir} ({files})"]
    if parent_run_id and tracker is not None:
        lines.append(f"MLflow parent run: {parent_run_id}")
        lines.append(f"  open: {tracker.ui_command()}  ->  {tracker.ui_url()}")
    if not jobs:
        return "\n".join([*lines, "report: none (no job wrote results.json)"])
    lines.append(
        f"report: python -m spec_decode.views.report {sweep_dir}"
        + (f"   (or: python -m spec_decode.views.report --mlflow-run {parent_run_id})" if parent_run_id else "")
    )
    return "\n".join(lines)


def reasons(error: str, limit: int = 300) -> str:
    """Every reason an error gives, on one line: a head such as "preflight failed:" and each "  - item" below
    it (the head alone says nothing), each cut at ``limit`` characters."""
    lines = [x.strip() for x in error.splitlines() if x.strip()]
    if not lines:
        return ""
    items = "; ".join(x.removeprefix("- ")[:limit] for x in lines[1:])
    return f"{lines[0][:limit]} {items}" if items else lines[0][:limit]


def planned_jobs(config) -> list[str] | None:
    """The jobs the basic sweeper launches (the experiment's sweeper params, then the command line),
    each as its overrides minus the excluded keys; None for other sweepers (their jobs are decided live)."""
    if "BasicSweeper" not in str(OmegaConf.select(config, "hydra.sweeper._target_") or ""):
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(OmegaConf.select(config, "hydra.overrides.task") or [])
    skip = set(OmegaConf.select(config, "hydra.job.config.override_dirname.exclude_keys") or [])
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)[0]
    return [",".join(o for o in job if o.lstrip("+~").partition("=")[0] not in skip) for job in batches]


def unfinished_lines(sweep_dir: Path, jobs: list[str] | None) -> list[str]:
    """The planned jobs without a record: never started (NOT RUN) or stopped before writing one."""
    if jobs is None:
        return []
    lines = []
    for i, job in enumerate(jobs):
        dirs = list(sweep_dir.glob(f"{i}_*"))
        if not dirs:
            lines.append(f"  NOT RUN {job or 'defaults'}")
        elif not any((d / results.FILENAME).exists() for d in dirs):
            lines.append(f"  KILLED {job or 'defaults'}: interrupted before its record was written")
    return lines


def headline(recs: list, jobs: list[str] | None) -> tuple[dict[str, float], dict[str, str]]:
    """The parent run's own metrics and params: the sweep's best numbers and what it varied."""
    done = [r for r in recs if r.status == "FINISHED"]
    spec = [r for r in done if r.speculative and "speedup_vs_baseline" in r.metrics]
    metrics: dict[str, float] = {"jobs_finished": len(done), "jobs_not_finished": len(recs) - len(done)}
    params: dict[str, str] = {}
    if done:
        metrics["best_throughput_tok_s"] = max(r.metrics.get("throughput_tok_s", 0.0) for r in done)
        params.update({g: str(done[0].choice(g)) for g in ("hardware", "engine", "model")})
    base = [
        r.metrics["throughput_tok_s"] for r in done if r.role == "baseline" and "throughput_tok_s" in r.metrics
    ] or [r.metrics["baseline_throughput_tok_s"] for r in spec if "baseline_throughput_tok_s" in r.metrics]  # paired
    if base:
        metrics["baseline_throughput_tok_s"] = base[0]
    if spec:
        best = max(spec, key=lambda r: r.metrics["speedup_vs_baseline"])
        metrics["best_speedup_vs_baseline"] = best.metrics["speedup_vs_baseline"]
        params["best_job"] = best.label[:500]
    params.update({f"sweep.{k}": ",".join(v)[:500] for k, v in sweep_axes(jobs).items()})
    return metrics, params


def sweep_axes(jobs: list[str] | None) -> dict[str, list[str]]:
    """The keys the planned jobs vary -> their values (``nccl`` -> [tuned, default])."""
    axes: dict[str, list[str]] = {}
    for job in jobs or []:
        for item in job.split(","):
            k, _, v = item.partition("=")
            if v not in axes.setdefault(k, []):
                axes[k].append(v)
    return {k: v for k, v in axes.items() if len(v) > 1}


# The process's exit status after a sweep (run.py reads it): 2 when a job was refused for bad input (its
# record's ``refused``), else 1 when no job finished. Per process (a sweep is one process; Hydra's basic
# launcher runs its jobs inside it), never read by a job.
EXIT_STATUS = 0


class SweepCallback(Callback):
    """Parent MLflow run per multirun; summary at the end (also on failure or Ctrl-C, via atexit)."""

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.sweep_dir: str | None = None
        self._tracker: Tracker | None = None
        self._done = False
        self.jobs: list[str] | None = None
        self._bar = None  # job i/N, elapsed, ETA (terminal only)
        self._clock: progress.SweepClock | None = None  # job k/N and ETA as plain lines (every console)
        self._labels: list[str] = []  # each planned job by what varies (the console's k/N lines)
        self._started = 0.0  # when this sweep began: a reused sweep dir's older files are not its own
        self._planned: int | None = None  # how many jobs the basic sweeper launches (None: another sweeper)

    def __getstate__(self) -> dict:
        # Shipped to submitit/joblib workers: the parent run id travels, the client does not.
        return {**self.__dict__, "_tracker": None, "_bar": None, "_clock": None}

    def on_multirun_start(self, config, **kwargs) -> None:
        _summary_modules()  # before the sweep starts: never first imported in the atexit path of a Ctrl-C
        interrupt.started()  # the sweep's dir, bar and parent run: from here on a Ctrl-C cleans up
        self._started = time.time()
        self.sweep_dir = str(Path(config.hydra.sweep.dir).resolve())
        Path(self.sweep_dir).mkdir(parents=True, exist_ok=True)
        planned = planned_jobs(config)
        self._planned = len(planned) if planned is not None else None
        for stale in self._would_refuse():  # an earlier dry run's, in a reused dir
            stale.unlink(missing_ok=True)
        root = Path(config.hydra.runtime.cwd)
        tcfg = config.tracking
        if config.get("dry_run"):
            return
        self.jobs = planned
        self._bar = progress.sweep_bar(len(self.jobs)) if self.jobs else None
        self._clock = progress.SweepClock(len(self.jobs)) if self.jobs else None
        self._labels = progress.what_varies(self.jobs) if self.jobs else []
        atexit.register(self._finalize)  # before the parent exists: a Ctrl-C from here on still closes it
        tracker = Tracker.from_config(tcfg, root)
        if tracker is not None:
            tags = {
                "spec_decode.role": "sweep",
                "spec_decode.sweep_dir": self.sweep_dir,
                "sweep.overrides": " ".join(OmegaConf.select(config, "hydra.overrides.task") or []),
                "experiment": str(config.get("name")),
            }
            try:
                run = tracker.client.create_run(
                    tracker.experiment_id(),
                    run_name=f"sweep {config.get('name')} {Path(self.sweep_dir).name}",
                    tags=tags,
                )
                self.parent_run_id = run.info.run_id
                self._tracker = tracker
            except Exception as e:  # noqa: BLE001
                print(
                    f"warning: MLflow store {tracker.uri} unreachable ({e}); jobs keep results.json; "
                    "upload later: python -m spec_decode.views.tracking sync " + self.sweep_dir,
                    file=sys.stderr,
                )

    def _would_refuse(self) -> list[Path]:
        """This sweep's dry-run jobs that preflight would stop (their dirs ``<num>_...``; every dir's with a
        sweeper that plans no fixed list)."""
        assert self.sweep_dir is not None
        dirs = [f"{n}_*" for n in range(self._planned)] if self._planned is not None else ["*"]
        return sorted(p for d in dirs for p in Path(self.sweep_dir).glob(f"{d}/{WOULD_REFUSE}"))

    def on_job_start(self, config, **kwargs) -> None:
        # Read by run.py in the job's process (also under joblib/submitit: the callback is pickled).
        if self.parent_run_id:
            os.environ[PARENT_ENV] = self.parent_run_id
        if self.sweep_dir:
            os.environ["SPEC_DECODE_SWEEP_DIR"] = self.sweep_dir
        # what the sweep varies on purpose: the drift guard compares each NCCL profile with its own history
        os.environ[AXES_ENV] = ",".join(sweep_axes(self.jobs))
        os.environ[STARTED_ENV] = repr(self._started)
        if self._bar is not None:
            self._bar.set_postfix_str(f"; running job {self._bar.n + 1}/{self._bar.total}")
        if self._clock is not None:
            num = OmegaConf.select(config, "hydra.job.num")
            self._clock.start(self._labels[num] if isinstance(num, int) and num < len(self._labels) else "")

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if self._bar is not None:
            self._bar.update(1)
        if self._clock is not None:
            self._clock.end()

    def on_multirun_end(self, config, **kwargs) -> None:
        self._finalize()

    def _finalize(self) -> None:
        if self._done or self.sweep_dir is None:
            return
        self._done = True
        blocks, control, recommend, log_acceptance_plots, write_plots, sweep_summary = _summary_modules()
        if self._bar is not None:
            self._bar.close()
        recs = results.collect(Path(self.sweep_dir))
        text, table = sweep_summary(recs)
        if not recs:  # a dry run, or every job stopped before its record: no table, no intervals to label
            text = "no job wrote results.json"
        missing = unfinished_lines(Path(self.sweep_dir), self.jobs)
        if interrupt.interrupted() or missing:
            head = f"{interrupt.MESSAGE}: " if interrupt.interrupted() else ""
            n = len(self.jobs or [])
            text += f"\n{head}{n - sum(x.startswith('  NOT RUN') for x in missing)} of {n} planned job(s) started"
            text += "".join("\n" + x for x in missing)
            if any(r.speculative and r.status == "FINISHED" for r in recs):  # a recommendation weighed what ran
                text += f"\n{PARTIAL}: the recommendation above weighs only the {len(recs)} job(s) that wrote a record"
        print(text, file=sys.stderr)
        Path(self.sweep_dir, "sweep_summary.txt").write_text(text + "\n")
        statuses = {r.status for r in recs}
        status = (
            "KILLED"
            if "KILLED" in statuses or interrupt.interrupted()
            else ("FAILED" if statuses - {"FINISHED"} else "FINISHED")
        )
        if not recs:
            status = "FAILED"
        if self._tracker is not None and self.parent_run_id:
            c = self._tracker.client
            try:
                c.log_text(self.parent_run_id, text, "sweep_summary.txt")
                c.log_table(self.parent_run_id, table, "sweep_summary.json")
                metrics, params = headline(recs, self.jobs)
                for k, v in metrics.items():
                    c.log_metric(self.parent_run_id, k, round(v, 4))
                for k, v in params.items():
                    c.log_param(self.parent_run_id, k, v)
                # The run's description (shown on its page without a click) is the table.
                c.set_tag(
                    self.parent_run_id,
                    "mlflow.note.content",
                    markdown_summary(table, self.sweep_dir) + "".join(f"\n\n**{x.strip()}**" for x in missing),
                )
                if interrupt.interrupted():
                    c.set_tag(self.parent_run_id, "spec_decode.interrupted", interrupt.MESSAGE)
                # The saved view opens with this sweep's children unfolded.
                for key, value in experiment_tags(expanded=[self.parent_run_id]).items():
                    c.set_experiment_tag(self._tracker.experiment_id(), key, value)
                for png in write_plots(recs, Path(self.sweep_dir)):
                    c.log_artifact(self.parent_run_id, str(png), artifact_path="plots")
                for rec in recs:  # each spec child's own charts, drawn here: not in a job's harness time
                    if rec.mlflow_run_id:
                        log_acceptance_plots(c, rec.mlflow_run_id, rec)
                cells = blocks.cells(recs)  # issue 25: the A/A control's verdict as a tag (ok | disagree | none)
                c.set_tag(self.parent_run_id, "aa_control", control.tag(control.check(cells)))
                choice = recommend.recommend(cells)
                if choice is not None:  # the step recommendation: a tag to filter by, the verdicts in full
                    partial = f"{PARTIAL}: " if interrupt.interrupted() or missing else ""
                    c.set_tag(self.parent_run_id, "recommendation", partial + recommend.tag(choice))
                    c.log_dict(self.parent_run_id, choice.as_dict(), "recommendation.json")
            except Exception as e:  # noqa: BLE001 - the summary is a view; the status must still land
                print(f"warning: sweep summary not logged to MLflow: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                try:
                    c.set_terminated(self.parent_run_id, status=status)
                except Exception as e:  # noqa: BLE001
                    print(f"warning: could not close the MLflow parent run: {e}", file=sys.stderr)
        print(where_to_look(self.sweep_dir, self.parent_run_id, self._tracker, len(recs)), file=sys.stderr)
        global EXIT_STATUS
        # the exit status from this sweep's records alone (a reused sweep dir holds an earlier sweep's too)
        mine = [r for r in recs if (r.ended_at or r.started_at or 0) >= self._started]
        refused = [r for r in mine if r.refused]
        would = self._would_refuse()  # this dry run's jobs that preflight would stop
        if refused and not interrupt.interrupted():
            EXIT_STATUS = 2  # bad input, as a single job's: a script must not read the sweep as clean
            print(
                f"error: {len(refused)} job(s) refused for bad input (each a FAILED record naming the key; "
                f"the other jobs ran): exit status 2\n"
                + "\n".join(f"  {r.label}: {reasons(r.error or '')}" for r in refused),
                file=sys.stderr,
            )
        if would and not interrupt.interrupted():
            EXIT_STATUS = 2  # the dry run's answer: these jobs would not start
            print(
                f"error: {len(would)} job(s) of this dry run would be refused by preflight (each with its "
                f"reasons, also in its dir's {WOULD_REFUSE}): exit status 2\n"
                + "\n".join(f"  {p.parent.name}: {'; '.join(p.read_text().splitlines())}" for p in would),
                file=sys.stderr,
            )
        if (
            not (refused or would)
            and mine
            and not interrupt.interrupted()
            and not any(r.status == "FINISHED" for r in mine)
        ):
            EXIT_STATUS = 1  # run.py exits with it: a script or CI must not read an all-failed sweep as done
            print(
                f"error: no job of the sweep finished ({len(mine)} recorded, none FINISHED): exit status 1; "
                f"each job's error is in the summary above and in its run.log",
                file=sys.stderr,
            )
