"""Every command of README.md's newcomer sections, run as written in a fresh clone (issue 29).

    python benchmarks/readme_commands.py              # tiers test + job: every cheap command, single jobs
    python benchmarks/readme_commands.py --sweeps     # + the multi-job sweeps and the experiment rerun
    python benchmarks/readme_commands.py --rebuild    # + model rebuilds, `dvc exp run`, long benchmarks
    python benchmarks/readme_commands.py --install    # the quick start's install line itself (a new .venv)
    python benchmarks/readme_commands.py --list       # the commands and their kinds; runs nothing
    python benchmarks/readme_commands.py --tier sweep --only fail_fast   # one command (a regex), its tier

What it reads: the ```bash blocks and the inline `python …` / `dvc …` / `mlflow …` spans of the sections
in SECTIONS, found by their headings in the clone's README.md, then those of every experiment README
(experiments/*/README.md, whole), so a README edit is picked up. Each
command gets a kind from the first rule in RULES that matches it; a command that no rule matches is a
failure ("unknown kind"), so a new README command cannot go unchecked. Kinds that cannot run here (a GPU,
sglang's CUDA 13 wheels, an S3 bucket) are "never" by a stated rule, and the rule is checked. After each
command what git tracks must be as before it (`git status`), unless the rule says the command writes
committed files (a re-report, DVC bookkeeping); a re-report's files are put back for the next command.
The dry `dvc repro [-s -f] X@Y` lines between two commands that may change what DVC sees are checked in
one DVC run of all their stages (run_dry_repros); when it does not pass, each line runs alone.

Where: `git clone` of the repository's HEAD into a temp dir: what is committed, not the working tree.
Environment: by default the clone's `.venv` is a link to the running interpreter's venv, and the install
steps of the quick start's first line (`python3 -m venv .venv`, `pip install …`) are left out; the rest
of that line, and every other command, runs as written through bash. Why: the install resolves the
whole dependency tree (minutes from this machine's local wheel mirror; elsewhere the network), which
the test in the suite cannot afford; `--install` runs the line exactly as written, and every later
command then uses the clone's own new .venv. `PYTHONPATH` is the clone, so the clone's code runs even
through the linked venv's editable install. Jobs take CPU slots from a pool of this run's own
(SPEC_DECODE_SLOTS_DIR), not the machine-wide one. `MLFLOW_TRACKING_URI` is unset: the README's default
store (`sqlite:///mlflow.db` in the clone) is used.

Placeholders (`<name>`, `SWEEP_A`, a bucket, a drafter you obtain) are replaced by the stand-ins in
STAND_INS; the table says so in its "ran as" column.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from readme_extract import ROOT, TIERS, Command, Rule, classify, extract, extract_experiments, substitute

TIMEOUT_S = {"test": 300, "job": 900, "sweep": 3600, "rebuild": 7200}
TRACEBACK = r"Traceback \(most recent call last\)"


@dataclass
class Row:
    cmd: Command
    kind: str
    tier: str
    ran_as: str = "not run"
    rc: int | None = None
    seconds: float = 0.0
    status: str = "skip"  # pass | FAIL | skip | never
    check: str = ""
    output: str = field(default="", repr=False)


class Clone:
    """A fresh clone of REPO's HEAD with an environment in which the README's commands run."""

    def __init__(self, repo: Path, work: Path, install: bool):
        self.dir, self.tmp, self.install, self.vars = work / "repo", work, install, {}
        subprocess.run(["git", "clone", "-q", str(repo), str(self.dir)], check=True)
        slots = work / "slots"
        slots.mkdir()
        venv_bin = str(Path(sys.prefix) / "bin")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VIRTUAL_ENV"))}
        self.env = {
            **env,
            "PATH": f"{venv_bin}:{env.get('PATH', '')}",
            "PYTHONPATH": str(self.dir),
            "DVC_NO_ANALYTICS": "1",
            "HF_HUB_OFFLINE": "1",
            "SPEC_DECODE_SLOTS_DIR": str(slots),
            "OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY", "PASSIVE"),
        }
        if not install:
            (self.dir / ".venv").symlink_to(sys.prefix)
        # the gpu-* rows expect this machine's refusal (no GPU; sglang absent, or installed for the contract
        # tests as on CI); a GPU box runs them for real
        self.gpu_box = bool(shutil.which("nvidia-smi"))
        self.has_sglang = importlib.util.find_spec("sglang") is not None

    def use_own_venv(self):
        own = self.dir / ".venv" / "bin"
        if self.install and own.is_dir():
            self.env["PATH"] = f"{own}:{self.env['PATH'].split(':', 1)[1]}"

    def git_status(self) -> set[str]:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=self.dir, capture_output=True, text=True)
        return set(out.stdout.splitlines())

    def restore(self, changed: set[str]) -> None:
        """Put back what a re-report rewrote (tracked files from HEAD, new files removed)."""
        paths = [line[3:] for line in changed]
        tracked = [p for line, p in zip(changed, paths) if not line.startswith("??")]
        if tracked:
            subprocess.run(["git", "checkout", "HEAD", "--", *tracked], cwd=self.dir, check=True)
        for line, p in zip(changed, paths):
            if line.startswith("??"):
                subprocess.run(["git", "clean", "-fdq", "--", p], cwd=self.dir, check=True)

    def bash(self, script: str, timeout: float) -> tuple[int, str, float]:
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                ["bash", "-c", script],
                cwd=self.dir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
            )
            return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            return 124, out + f"\n[timed out after {timeout:.0f} s]", time.monotonic() - t0


def make_stand_in(clone: Clone, maker: str) -> None:
    d = clone.dir
    if maker == "drafter_files" and not (d / "models/drafters/kimi-k2.5-eagle3").exists():
        w = d / "models/drafters/kimi-k2.5-eagle3"  # two small files stand for GBs of weights
        w.mkdir(parents=True)
        (w / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}\n')
        (w / "model.safetensors").write_bytes(os.urandom(4096))
    elif maker == "spec_bench" and not (d / "data/spec_bench.jsonl").exists():
        import json  # MT-Bench / Spec-Bench question.jsonl lines: "turns", "category"

        prompts = [json.loads(x) for x in (d / "data/prompts.jsonl").read_text().splitlines()[:4]]
        (d / "data/spec_bench.jsonl").write_text(
            "".join(
                json.dumps({"question_id": i, "category": ("writing", "reasoning")[i % 2], "turns": [p["text"]]}) + "\n"
                for i, p in enumerate(prompts)
            )
        )
    elif maker == "small_sweep" and "sweep_dir" not in clone.vars:
        rc, out, _ = clone.bash(
            "python run.py -m spec.steps=1,3 benchmark.max_new_tokens=48 benchmark.runs=2", TIMEOUT_S["job"]
        )
        sweep = re.search(r"sweep dir: (\S+)", out)
        parent = re.search(r"MLflow parent run: (\w+)", out)
        if rc != 0 or not sweep or not parent:
            raise RuntimeError(f"the stand-in sweep failed (exit {rc}):\n{out[-2000:]}")
        clone.vars.update(sweep_dir=sweep.group(1), parent_id=parent.group(1))


def expect(rule: Rule, row: Row, clone: Clone) -> str:
    """'' if the outcome is what the rule promises, else what is wrong."""
    out = row.output
    if re.search(TRACEBACK, out):
        return "a traceback"
    if rule.test_form == " --help" and row.ran_as.endswith(" --help"):  # the cheap form: its usage
        rule = dataclasses.replace(rule, rc=(0,), must=(r"usage:",))
    if row.rc not in rule.rc:
        return f"exit {row.rc}, expected {'/'.join(map(str, rule.rc))}"
    for pat in rule.must:
        if not re.search(pat, out):
            return f"output lacks /{pat}/"
    text = row.ran_as
    if rule.kind == "dvc-read" and text.startswith("dvc status") and "up to date" not in out:
        return "dvc status is not clean"
    if rule.kind == "dvc-read" and text.startswith("dvc metrics diff") and out.strip():
        return "dvc metrics diff shows a difference in a fresh clone"
    if rule.kind.startswith("repro") and rule.test_form and text.endswith("--dry"):
        running = set(re.findall(r"Running stage '([^']+)'", out))
        if rule.kind == "repro-stages":  # as its README says: up to date in a fresh clone
            return f"would run {sorted(running)} in a fresh clone" if running else ""
        named = {a for a in shlex.split(text)[2:] if not a.startswith("-")}
        if text.startswith("dvc exp run"):  # -S PARAM=VALUE: the stages that read it
            named = set()
            if not running:
                return "would run no stage"
        if rule.kind == "repro-plain" and running:
            return f"would run {sorted(running)}"
        if " -s " in text and running != named:
            return f"would run {sorted(running)}, not exactly {sorted(named)}"
        if not named <= running:
            return f"would not run {sorted(named - running)}"
    if rule.kind == "repro-plain" and "Running stage" in out:
        return "ran stages in a fresh clone"
    if rule.kind == "experiment-view" and " headline " in text:
        if subprocess.run(["git", "diff", "--quiet", "README.md"], cwd=clone.dir).returncode != 0:
            return "README's table differs from what the committed metrics.json gives"
    hint = re.search(r"To track the changes with git, run:\s+git add ([^\n]+)", out)
    if rule.kind == "dvc-write" and hint:  # what `dvc add` asks to commit, the command commits
        staged = subprocess.run(
            ["git", "diff", "--cached", "--name-only"], cwd=clone.dir, capture_output=True, text=True
        ).stdout.split()
        left = [f for f in hint.group(1).split() if f not in staged]
        if left:
            return f"leaves {' '.join(left)} out of git (dvc add asks for it)"
    if rule.kind == "dvc-write" and text.startswith("dvc pull"):
        target = clone.dir / shlex.split(text)[2]
        if not target.exists():
            return f"{target.name} not restored"
    return ""


def run_server(row: Row, clone: Clone) -> None:
    if socket.socket().connect_ex(("127.0.0.1", 5000)) == 0:
        row.status, row.check = "FAIL", "port 5000 already taken by another process: cannot run as written"
        return
    log = open(clone.tmp / "mlflow_ui.log", "w+")
    t0 = time.monotonic()
    p = subprocess.Popen(
        ["bash", "-c", row.ran_as],
        cwd=clone.dir,
        env=clone.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        while time.monotonic() - t0 < 120 and p.poll() is None:
            try:
                with urllib.request.urlopen("http://127.0.0.1:5000/", timeout=5) as r:
                    row.rc = 0 if r.status == 200 else r.status
                    break
            except OSError:
                time.sleep(1)
    finally:
        row.seconds = time.monotonic() - t0
        if p.poll() is None:
            os.killpg(p.pid, 15)
        p.wait(30)
    log.seek(0)
    row.output = log.read()
    ok = row.rc == 0
    row.status, row.check = (
        ("pass", "HTTP 200 from 127.0.0.1:5000; stopped")
        if ok
        else ("FAIL", f"no HTTP 200 within 120 s (exit {p.returncode})")
    )


def never_check(rule: Rule, clone: Clone, text: str = "") -> str:
    if rule.kind == "gpu-session" and not (clone.dir / shlex.split(text)[1]).is_file():
        return f"{shlex.split(text)[1]} is not in the clone"
    if rule.kind == "gpu-stage":
        stage = re.search(rule.pattern, text).group(1)
        block = re.search(rf"^  {stage}:\n((?:    .*\n)+)", (clone.dir / "dvc.yaml").read_text(), re.M)
        if not block or "frozen: true" not in block.group(1):
            return f"dvc.yaml has no frozen stage {stage}"
    if rule.kind == "gpu-install":
        source = (clone.dir / "spec_decode/engines/sglang.py").read_text()
        tested = re.search(r'^TESTED_VERSION = "([\d.]+)"', source, re.M).group(1)
        extra = re.search(r'^sglang = \["sglang==([\d.]+)"\]', (clone.dir / "pyproject.toml").read_text(), re.M)
        if not extra or extra.group(1) != tested:
            return f"pyproject's sglang extra is {extra and extra.group(1)}, the tested version {tested}"
    return ""


def prepare(cmd: Command, rule: Rule | None, tiers: set, clone: Clone) -> tuple[Row, str | None]:
    """The row of a command and what to run for it (None: the row is final, nothing to run)."""
    if rule is None:
        return Row(cmd, "unknown", "-", status="FAIL", check="no rule in RULES matches: classify it"), None
    row = Row(cmd, rule.kind, rule.tier, check=rule.why)
    if rule.tier == "never" and not rule.test_form:
        problem = never_check(rule, clone, cmd.text)
        row.status, row.check = ("FAIL", problem) if problem else ("never", rule.why)
        return row, None
    if clone.gpu_box and rule.kind in ("gpu-sweep", "doctor-gpu"):
        row.check = "a GPU box: the refusal expected here does not apply; run it as written"
        return row, None
    text, used = substitute(cmd.text)
    row.tier = max([rule.tier, *(s.tier for s in used)], key=lambda t: (TIERS + ("never",)).index(t))
    if row.tier not in tiers and not (rule.test_form and "test" in tiers):
        return row, None
    if row.tier not in tiers or rule.kind == "suite":  # the cheap form (the suite: always)
        text += rule.test_form
    try:
        for s in used:
            if s.maker:
                make_stand_in(clone, s.maker)
    except RuntimeError as e:
        row.status, row.check = "FAIL", str(e)
        return row, None
    text = text.format(tmp=clone.tmp, **clone.vars)
    if rule.kind == "install" and not clone.install:  # the venv is linked: the install steps are left out
        text = " && ".join(p for p in text.split(" && ") if not p.startswith(("python3 -m venv", "pip install")))
    return row, text


def execute(row: Row, rule: Rule, text: str, clone: Clone) -> Row:
    """Run the prepared command through bash in the clone and judge it by its rule."""
    if rule.kind == "dvc-write" and text.startswith("dvc pull"):  # as on the GPU box: neither copy nor cache
        shutil.rmtree(clone.dir / shlex.split(text)[2], ignore_errors=True)
        shutil.rmtree(clone.dir / ".dvc" / "cache", ignore_errors=True)
    row.ran_as = text
    if rule.kind == "server":
        run_server(row, clone)
        return row
    before = clone.git_status()
    row.rc, row.output, row.seconds = clone.bash(text, TIMEOUT_S.get(row.tier, TIMEOUT_S["test"]))
    if rule.kind == "install":
        clone.use_own_venv()
    problem = expect(rule, row, clone)
    changed = clone.git_status() ^ before
    if changed and rule.keeps_git and not problem:
        problem = f"changed what git tracks: {', '.join(sorted(line[3:] for line in changed))[:500]}"
    if changed and rule.restores:
        clone.restore(clone.git_status() - before)
    row.status, row.check = ("FAIL", problem) if problem else ("pass", rule.why)
    return row


def for_this_box(rule: Rule | None, clone: Clone) -> Rule | None:
    """The rule as it applies here: where sglang is installed but no GPU is, its with_sglang outcome."""
    if rule is not None and rule.with_sglang and clone.has_sglang and not clone.gpu_box:
        rc, must, why = rule.with_sglang
        rule = dataclasses.replace(rule, rc=rc, must=must, why=why)
    return rule


def run_one(cmd: Command, rule: Rule | None, tiers: set, clone: Clone) -> Row:
    rule = for_this_box(rule, clone)
    row, text = prepare(cmd, rule, tiers, clone)
    return row if text is None else execute(row, rule, text, clone)


# `dvc repro [-s -f] STAGE...` of several README lines: one dry DVC process asked for all their stages gives
# each line's answer when it passes (run_dry_repros); any other outcome runs each line alone for its verdict.
BATCHED = ("repro-stages", "repro-experiment")
REPRO = re.compile(r"^dvc repro (-s -f )?([\w-]+@[\w-]+(?: [\w-]+@[\w-]+)*)( --dry)?$")


def dry_repro_group(rule: Rule | None, text: str | None) -> str | None:
    """The group a prepared command is checked in together ('' plain, '-s -f '), None: on its own."""
    if rule is None or text is None or rule.kind not in BATCHED or not (m := REPRO.match(text)):
        return None
    if m.group(1) and not m.group(3):
        return None  # a re-report that runs for real (the job tier)
    return m.group(1) or ""


def run_dry_repros(flags: str, batch: list[tuple[Row, Rule, str]], clone: Clone) -> list[Row]:
    """One `dvc repro FLAGS A B ... --dry` for the stages of every line in the batch. Its answer is each
    line's when it passes what each line's rule asks: exit 0, no traceback, git as it was, and the stages
    it would run are none (plain `dvc repro X@Y`, run as written or --dry: a fresh clone is up to date, and
    what one line would run is a subset of what all of them together would) or exactly the named ones
    (-s -f: each forced stage alone, so each line would run its own named stages). Otherwise each line
    runs alone, --dry, for its exact verdict: the stages it would run, named (nothing ran before)."""
    if len(batch) > 1:
        named = list(dict.fromkeys(a for _, _, text in batch for a in shlex.split(text)[2:] if "@" in a))
        together = f"dvc repro {flags}{' '.join(named)} --dry"
        before = clone.git_status()
        rc, out, seconds = clone.bash(together, TIMEOUT_S["test"])
        running = set(re.findall(r"Running stage '([^']+)'", out))
        ok = rc == 0 and not re.search(TRACEBACK, out) and clone.git_status() == before
        if ok and (running == set(named) if flags else not running):
            for row, rule, _ in batch:
                row.ran_as, row.rc, row.output, row.seconds = together, rc, out, seconds / len(batch)
                row.status, row.check = "pass", f"{rule.why}; checked with the stages of {len(batch) - 1} more lines"
            return [row for row, _, _ in batch]
    # alone: a plain line --dry too (a stale stage is named, not run for real: minutes of a sweep)
    dry = (lambda t: t if t.endswith(" --dry") else f"{t} --dry") if not flags else (lambda t: t)
    return [execute(row, rule, dry(text), clone) for row, rule, text in batch]


def run_commands(cmds: list[Command], tiers: set, clone: Clone, only: str = "", log=None) -> list[Row]:
    """Each command in order (those of the asked tiers run); the dry `dvc repro` lines between two commands
    that may change what DVC sees (a rule that lets git change) are checked together (run_dry_repros)."""
    rows: list[Row] = []
    pending: dict[str, list[tuple[Row, Rule, str]]] = {}

    def done(*finished: Row) -> None:
        for row in finished:
            if log:
                log(
                    f"[{row.status}] {row.kind}: {row.ran_as if row.ran_as != 'not run' else row.cmd.text} "
                    f"({row.seconds:.1f} s) {row.check}",
                    flush=True,
                )

    def flush() -> None:
        for flags, batch in pending.items():
            done(*run_dry_repros(flags, batch, clone))
        pending.clear()

    for cmd in cmds:
        rule = for_this_box(classify(cmd), clone)
        if any(s.maker for s in substitute(cmd.text)[1]):
            flush()  # its stand-ins are made before it: the dry repros before it see the clone without them
        row, text = prepare(cmd, rule, tiers if re.search(only, cmd.text) else set(), clone)
        rows.append(row)
        group = dry_repro_group(rule, text)
        if group is not None:
            pending.setdefault(group, []).append((row, rule, text))
            continue
        if text is not None and not rule.keeps_git and not text.endswith(" --help"):
            flush()  # a command that may change what DVC sees: the dry repros before it are checked first
        done(execute(row, rule, text, clone) if text is not None else row)
    flush()
    return rows


def run_all(clone: Clone, tiers: set, log=print, only: str = "") -> list[Row]:
    """Every command of the clone's README, in order; those of the asked tiers run, the rest are rows too
    (`only`: a regex; commands it does not match are not run)."""
    cmds, seen = [], set()
    for cmd in extract((clone.dir / "README.md").read_text()) + extract_experiments(clone.dir):
        if substitute(cmd.text)[0] in seen:  # the same command in another README: run once
            continue
        seen.add(substitute(cmd.text)[0])
        cmds.append(cmd)
    return run_commands(cmds, tiers, clone, only=only, log=log)


def table(rows: list[Row]) -> str:
    def cell(s: str, n: int = 90) -> str:
        s = s.replace("|", "\\|")
        return s if len(s) <= n else s[: n - 1] + "…"

    out = [
        "| # | README line | command (as written) | kind | tier | ran as | exit | s | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        ran = "as written" if r.ran_as == r.cmd.text else cell(r.ran_as, 70)
        if r.ran_as == "not run":
            ran = "not run"
        out.append(
            f"| {i} | {r.cmd.line if '/' not in r.cmd.section else f'{r.cmd.section}:{r.cmd.line}'} | "
            f"`{cell(r.cmd.text)}` | {r.kind} | {r.tier} | {ran} | "
            f"{'' if r.rc is None else r.rc} | {r.seconds:.1f} | {r.status}: {cell(r.check, 100)} |"
        )
    counts = {s: sum(r.status == s for r in rows) for s in ("pass", "FAIL", "skip", "never")}
    out.append(
        f"\n{len(rows)} commands: {counts['pass']} passed, {counts['FAIL']} failed, "
        f"{counts['skip']} not run (tier not asked for), {counts['never']} never run here (by rule)"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=ROOT, help="the git repository to clone (its HEAD)")
    ap.add_argument("--sweeps", action="store_true", help="also the multi-job sweeps, experiment reruns")
    ap.add_argument("--rebuild", action="store_true", help="also model rebuilds and long benchmarks")
    ap.add_argument("--tier", choices=TIERS, help="only this tier (test = what the suite's test runs)")
    ap.add_argument("--install", action="store_true", help="run the install line as written (new .venv)")
    ap.add_argument("--list", action="store_true", help="print the commands and their kinds; run nothing")
    ap.add_argument("--only", default="", metavar="REGEX", help="run only the commands this matches")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args(argv)
    if args.list:
        for c in extract((args.repo / "README.md").read_text()) + extract_experiments(args.repo):
            rule = classify(c)
            print(f"{c.line:4d} {rule.kind if rule else 'UNKNOWN':16s} {rule.tier if rule else '-':8s} {c.text}")
        return 0
    tiers = (
        {args.tier}
        if args.tier
        else {"test", "job"} | ({"sweep"} if args.sweeps else set()) | ({"sweep", "rebuild"} if args.rebuild else set())
    )
    work = Path(tempfile.mkdtemp(prefix="readme_commands_"))
    head = subprocess.run(
        ["git", "-C", str(args.repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    start, load0 = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()
    try:
        rows = run_all(Clone(args.repo, work, args.install), tiers, only=args.only)
        print(
            f"\n{start} to {time.strftime('%H:%M')}, clone of {head}, tiers {', '.join(sorted(tiers))}, "
            f"{'install line run as written' if args.install else 'venv linked (install steps left out)'}; "
            f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load0)} at the start, "
            f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n"
        )
        print(table(rows))
        for r in rows:
            if r.status == "FAIL" and r.output:
                print(f"\n--- {r.ran_as} (exit {r.rc}): last lines ---\n{r.output[-1500:]}")
    finally:
        print(f"clone: {work / 'repo'}" if args.keep else "", end="")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
