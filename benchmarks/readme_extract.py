"""Which commands README.md's newcomer sections give, and what kind each is (for readme_commands.py).

The sections are found by heading (SECTIONS); their ```bash blocks give one command per logical line
(backslash continuations joined, trailing comments dropped), and inline spans whose first word is a
command (COMMAND_WORDS) count too. RULES gives each command a kind, a tier (who runs it) and what is
checked; the first rule that matches wins, and a command none matches has no kind: a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "Quick start",
    "What a job does",
    "DVC: models, data and reported results",
    "Running on a GPU box with SGLang",
)
COMMAND_WORDS = {"python", "python3", "dvc", "spec-decode", "mlflow", "pip", "git", "bash", "nvidia-smi", "."}
TIERS = ("test", "job", "sweep", "rebuild")  # never: not run here, by the rule's stated reason


@dataclass
class Command:
    section: str
    line: int  # README line where it starts
    text: str  # as written (continuations joined, trailing comment dropped)
    inline: bool = False
    prose: bool = False  # an inline span used as a word (`dvc add`-ed)


@dataclass
class Rule:
    kind: str
    pattern: str  # re.search on the command (after stand-ins)
    tier: str
    why: str  # what it checks, or why it never runs here
    rc: tuple = (0,)
    must: tuple = ()  # regexes the output must contain
    test_form: str = ""  # in the test tier, what is appended ("--dry") instead of running as written
    # where sglang is installed but no GPU is (CI installs it for the contract tests): (rc, must, why)
    with_sglang: tuple | None = None
    # issue 44: what git tracks is as it was after the command (checked), unless the command's job is to
    # write committed files (a re-report, DVC bookkeeping); restores: then put back for the next command
    keeps_git: bool = True
    restores: bool = False


RULES = [
    Rule("prose", r"^$", "never", "a command word used in a sentence (`dvc add`-ed), not a command"),
    Rule("elided", r"…", "never", "an illustration with … elisions; not runnable as written"),
    Rule(
        "gpu-install",
        r"^pip install -e '\.\[sglang\]'",
        "never",
        "installs sglang's CUDA 13 wheels (GPU box); checked: pyproject's sglang extra pins the tested version",
    ),
    Rule("gpu-only", r"^nvidia-smi", "never", "needs an NVIDIA driver"),
    Rule(
        "gpu-bundle",
        r"^python benchmarks/gpu/sglang_bundle\.py$",
        "never",
        "downloads SGLang 0.5.17's wheels from PyPI and packs them for the lent GPU (minutes of xz); --help here",
        must=(r"usage:",),
        test_form=" --help",
    ),
    Rule("gpu-session", r"^bash benchmarks/gpu/\S+\.sh\b", "never", "the GPU box's session script; checked: it exists"),
    Rule(
        "gpu-stage",
        r"^dvc unfreeze (\w+) && dvc repro -f \1\b",
        "never",
        "reruns a GPU experiment's stage on the box; checked: the stage is frozen in dvc.yaml (no GPU here)",
    ),
    Rule(
        "gpu-sweep-dir",
        r"^python -m spec_decode\.views\.(report|tracking sync) experiments/\w+/sweep$",
        "never",
        "reads the sweep dir a GPU box wrote (ignored by git: not in a clone); --help here",
        must=(r"usage:",),
        test_form=" --help",
    ),
    Rule(
        "gpu-compare",
        r"^python -m spec_decode\.views\.experiment compare \w+ --rev <",
        "never",
        "compares the GPU box's rebuild with the commit holding the claim (metrics.json is the claim until then)",
    ),
    Rule("network", r"s3://|pip install 'dvc\[", "never", "needs the network and an S3 bucket of yours"),
    Rule(
        "install",
        r"^python3 -m venv \.venv",
        "job",
        "installs (or links) .venv, then the main job finishes",
        must=(r"\[FINISHED\]",),
    ),
    Rule(
        "suite",
        r"python -m pytest",
        "job",
        "the whole suite is ~11 min on 2 cores (docs/testing.md): run as written + --collect-only -n 0 (one "
        "process collects, not two workers) --assert=plain (every module imported as written, not rewritten "
        "first: rewriting is ~40% of a collection's CPU, and the suite itself rewrites); every test collects",
        must=(r"\d+ tests? collected",),
        test_form=" --collect-only -n 0 --assert=plain",
    ),
    Rule("server", r"^mlflow ui\b", "job", "serves the runs page on 127.0.0.1:5000 (HTTP 200), then stopped"),
    Rule("help", r"--help$", "test", "usage printed", must=(r"(?i)usage|== Configuration groups ==",)),
    Rule(
        "dry-run",
        r"\bdry_run=true\b",
        "test",
        "prints each job's server command; launches nothing",
        must=(r"# server command:",),
    ),
    Rule(
        "doctor-gpu",
        r"^python -m spec_decode\.runner\.doctor .*engine=sglang",
        "never",
        "launches sglang on the GPU box; here its --static-only form (README: launches nothing) must name "
        "the missing sglang with what to do",
        rc=(1,),
        must=(r"\[FAIL\] engine version: sglang is not installed", r"what to do:"),
        test_form=" --static-only",
        with_sglang=(
            (0,),
            (r"\[OK\] engine version: sglang 0\.5\.23", r"\[OK\] hook targets", r"0 failed"),
            "sglang installed, no GPU: the static checks pass; the launch is the GPU box's",
        ),
    ),
    Rule(
        "gpu-sweep",
        r"^python run\.py .*engine=sglang",
        "test",
        "without GPUs/sglang: each job refused in preflight, naming what is missing; no server; "
        "each refusal is bad input: exit 2",
        rc=(2,),
        must=(r"FAILED .*sglang is not installed", r"0 visible here", r"refused for bad input .*exit status 2"),
        with_sglang=(
            (2,),
            (r"FAILED .*needs \d+ GPU\(s\) for tp \d+; 0 visible here", r"refused for bad input .*exit status 2"),
            "sglang installed, no GPU: each job refused in preflight for the GPUs; exit 2",
        ),
    ),
    Rule(
        "repro-plain",
        r"^dvc repro$",
        "job",
        "a fresh clone: nothing runs",
        must=(r"Data and pipelines are up to date",),
        test_form=" --dry",
    ),
    Rule(
        "repro-stages",
        r"^dvc repro (?:[\w-]+@[\w-]+ ?)+$",
        "test",
        "reruns the named stages when what they depend on changed: a fresh clone runs none (--dry)",
        test_form=" --dry",
    ),
    Rule(
        "repro-experiment",
        r"^dvc repro -s -f (bench|report)@ci_smoke",
        "job",
        "re-reports: reruns exactly the named stages, rewriting the committed result (--dry in the test tier; "
        "the files put back after)",
        test_form=" --dry",
        keeps_git=False,
        restores=True,
    ),
    Rule(
        "repro-experiment",
        r"^dvc repro -s -f (bench|report)@",
        "sweep",
        "re-reports: reruns exactly the named stages, rewriting the committed result (--dry in the test tier; "
        "the files put back after)",
        test_form=" --dry",
        keeps_git=False,
        restores=True,
    ),
    Rule(
        "repro-models",
        r"^dvc (repro -f|exp run)",
        "rebuild",
        "rebuilds the named stages (and their upstream) (--dry in the test tier; the files put back after)",
        test_form=" --dry",
        keeps_git=False,
        restores=True,
    ),
    Rule(
        "experiment-rebuild",
        r"^python -m spec_decode\.bench rebuild ci_smoke\b",
        "job",
        "reruns it into experiments/<name>/rebuild/ (ignored by git): a verdict, git unchanged",
        rc=(0, 1),
        must=(r"verdict: (agree|DIFFER)",),
        test_form=" --help",
    ),
    Rule(
        "experiment-rebuild",
        r"^python -m spec_decode\.bench rebuild ",
        "sweep",
        "reruns it into experiments/<name>/rebuild/ (ignored by git): a verdict, git unchanged (--help in the "
        "test tier)",
        rc=(0, 1),
        must=(r"verdict: (agree|DIFFER)",),
        test_form=" --help",
    ),
    Rule(
        "drafter-bench",
        r"^python -m spec_decode\.bench drafters ",
        "sweep",
        "the drafter experiment's DVC stage: its sweep into the committed metrics.json (--help in the test "
        "tier; the files put back after)",
        test_form=" --help",
        keeps_git=False,
        restores=True,
    ),
    Rule(
        "benchmark",
        r"^python benchmarks/\w+\.py$",
        "rebuild",
        "the benchmark runs (--help in the test tier)",
        test_form=" --help",
    ),
    Rule(
        "dvc-read",
        r"^dvc (dag|status|metrics (diff|show( experiments/\w+/summary\.json)?)|exp show)$",
        "test",
        "reads the pipeline; clean",
    ),
    Rule("git-read", r"^git (diff|status|log)\b", "test", "reads git; a fresh clone: nothing to show"),
    Rule(
        "dvc-write",
        r"^dvc (remote add|add|pull)\b",
        "test",
        "git/DVC bookkeeping on stand-ins; files back",
        keeps_git=False,
    ),
    Rule(
        "experiment-compare",
        r"^python -m spec_decode\.views\.experiment compare ",
        "test",
        "a verdict (exit 1 when a cell differs)",
        rc=(0, 1),
        must=(r"verdict: (agree|DIFFER)",),
    ),
    Rule(
        "experiment-starts",
        r"^python -m spec_decode\.views\.experiment starts ",
        "test",
        "one design's sweeps from several machine starts (the committed H100 8B-shaped ones, or an experiment's "
        "record): a start effect, the next start",
        must=(r"a start effect shown in \d+ of \d+ tested",),
    ),
    Rule(
        "experiment-view",
        r"^python -m spec_decode\.views\.experiment (headline|report) ",
        "test",
        "renders from the committed metrics.json (headline: README's table unchanged)",
    ),
    Rule(
        "report",
        r"^python -m spec_decode\.views\.report ",
        "job",
        "tables and plots of a sweep of ours",
        must=(r"\.png",),
    ),
    Rule("job", r"^python run\.py(?! -m)", "job", "one job FINISHED", must=(r"\[FINISHED\]",)),
    Rule("sweep", r"^python run\.py -m ", "sweep", "the sweep ran; its summary printed", must=(r"job\(s\):",)),
]


def sections(readme: str) -> dict[str, list[tuple[int, str]]]:
    """'## ' heading -> its (line number, line) pairs; headings inside fenced blocks are not headings."""
    out: dict[str, list[tuple[int, str]]] = {}
    current, fenced = None, False
    for n, line in enumerate(readme.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            current = line[3:].strip()
            out[current] = []
            continue
        if current is not None:
            out[current].append((n, line))
    return out


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def extract(readme: str, wanted=SECTIONS) -> list[Command]:
    """The commands of the wanted sections, in README order: bash blocks, then inline spans (per section)."""
    found = sections(readme)
    missing = [s for s in wanted if s not in found]
    if missing:
        raise ValueError(f"README.md has no section(s) {missing}: update SECTIONS in {Path(__file__).name}")
    return _commands({name: found[name] for name in wanted})


def extract_experiments(root: Path) -> list[Command]:
    """Every command of the experiment READMEs (experiments/*/README.md, each whole), the file as the
    section (issue 44: a reported experiment's commands are run as written too)."""
    cmds = []
    for path in sorted(root.glob("experiments/*/README.md")):
        lines = list(enumerate(path.read_text().splitlines(), 1))
        cmds += _commands({str(path.relative_to(root)): lines})
    return cmds


def _commands(found: dict[str, list[tuple[int, str]]]) -> list[Command]:
    cmds: list[Command] = []
    for name, lines in found.items():
        fence, prose, pending = None, [], None
        for n, line in lines:
            if line.startswith("```"):
                fence = None if fence is not None else line[3:].strip()
                continue
            if fence is None:
                prose.append((n, line))
            elif fence in ("bash", "sh"):
                if pending is not None:  # a continuation of the previous line
                    pending.text += " " + line.strip()
                elif line.strip() and not line.lstrip().startswith("#"):
                    pending = Command(name, n, line.strip())
                else:
                    continue
                if pending.text.endswith("\\"):
                    pending.text = pending.text[:-1].rstrip()
                    continue
                pending.text = _strip_comment(pending.text)
                cmds.append(pending)
                pending = None
        text = "\n".join(line for _, line in prose)
        for m in re.finditer(r"`([^`]+)`", text):
            span = " ".join(m.group(1).split())
            if span.split()[0] not in COMMAND_WORDS:
                continue
            line = prose[text[: m.start()].count("\n")][0]
            after = text[m.end() : m.end() + 1]
            cmds.append(Command(name, line, span, inline=True, prose=bool(re.match(r"[-\w]", after))))
    seen, unique = set(), []
    for c in sorted(cmds, key=lambda c: c.line):
        if c.text not in seen:
            seen.add(c.text)
            unique.append(c)
    return unique


@dataclass
class StandIn:
    placeholder: str
    value: str  # what replaces it (may name a file the maker writes)
    maker: str = ""  # what make_stand_in makes before the command
    tier: str = "test"  # a maker that runs a sweep makes the command at least a job-tier one


STAND_INS = [
    StandIn("<name>", "ci_smoke"),
    StandIn("SWEEP_A SWEEP_B", "experiments/ci_smoke/metrics.json {sweep_dir}", "small_sweep", "job"),
    StandIn(
        "SWEEP_1 SWEEP_2 SWEEP_3",
        "experiments/real_shape_h100x1/metrics.json docs/data/real_shape_h100x1_2026-12-06_s8_rebuild_metrics.json "
        "docs/data/real_shape_h100x1_2026-12-06_s9_start3_metrics.json",
    ),
    StandIn("/mnt/shared/dvc-store", "{tmp}/dvc-store"),
    StandIn("models/drafters/kimi-k2.5-eagle3", "models/drafters/kimi-k2.5-eagle3", "drafter_files"),
    StandIn("data/spec_bench.jsonl", "data/spec_bench.jsonl", "spec_bench"),
    StandIn("multirun/2026-11-29/10-00-00_adhoc", "{sweep_dir}", "small_sweep", "job"),
    StandIn("<parent run id>", "{parent_id}", "small_sweep", "job"),
]


def substitute(text: str) -> tuple[str, list[StandIn]]:
    used = [s for s in STAND_INS if s.placeholder in text]
    for s in used:
        text = text.replace(s.placeholder, s.value)
    return text, used


def classify(cmd: Command) -> Rule | None:
    if cmd.prose:
        return RULES[0]
    text, _ = substitute(cmd.text)
    return next((r for r in RULES[1:] if re.search(r.pattern, text)), None)
