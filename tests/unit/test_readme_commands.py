"""Issue 29: every command of the README's newcomer sections is found and has a kind (benchmarks/readme_extract.py).

A command added to those sections that no rule knows fails here; the commands run in a fresh clone in
tests/integration/test_readme_commands.py and in `python benchmarks/readme_commands.py`."""

import re
import sys

import pytest

from ..conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_extract as rx  # noqa: E402

pytestmark = pytest.mark.unit
README = (ROOT / "README.md").read_text()


def commands(text=README):
    return rx.extract(text)


def test_every_line_of_every_bash_block_and_every_inline_command_is_extracted():
    """Counted another way: each non-comment line of the sections' bash blocks is part of one command, and
    each backticked span starting with a command word is one."""
    texts = [c.text for c in commands()]
    parts = rx.sections(README)
    lines = spans = 0
    for name in rx.SECTIONS:
        body = "\n".join(line for _, line in parts[name])
        for block in re.findall(r"```bash\n(.*?)```", body, re.S):
            for line in block.splitlines():
                code = re.sub(r"\s+#\s.*$", "", line).strip().rstrip("\\").strip()
                if code and not code.startswith("#"):
                    lines += 1
                    assert any(code in t for t in texts), f"{name}: {code!r} not extracted"
        prose = re.sub(r"```.*?```", "", body, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            if span.split()[0] in ("python", "python3", "dvc", "mlflow", "spec-decode", "pip", "nvidia-smi"):
                spans += 1
                assert " ".join(span.split()) in texts, f"{name}: inline {span!r} not extracted"
    assert lines >= 25 and spans >= 15, (lines, spans)  # the sections as they stand (2026-12-01)


def test_every_command_has_a_kind_and_the_never_kinds_say_why():
    kinds = {}
    for c in commands():
        rule = rx.classify(c)
        assert rule is not None, f"README line {c.line}: {c.text!r} matches no rule in RULES"
        kinds.setdefault(rule.kind, []).append(c.text)
        if rule.tier == "never" and not rule.test_form:  # each stays out for the reason its rule states
            assert {
                "prose": c.prose,
                "elided": "…" in c.text,
                "gpu-install": "'.[sglang]'" in c.text,
                "gpu-only": c.text == "nvidia-smi",
                "gpu-session": c.text.startswith("bash ") and (rx.ROOT / c.text.split()[1]).is_file(),
                "network": "s3://" in c.text,
            }[rule.kind], c.text
    # what the suite's test runs in a fresh clone: the cheap ones, and the cheap form of the rest
    assert kinds["dvc-read"] == [
        "dvc dag",
        "dvc metrics diff",
        "dvc metrics show experiments/embedded_steps_nccl/summary.json",
        "dvc status",
        "dvc metrics show",
        "dvc exp show",
    ]
    assert kinds["repro-plain"] == ["dvc repro"] and len(kinds["dry-run"]) == 2 and len(kinds["doctor-gpu"]) == 1


def test_the_quick_start_keeps_two_set_up_commands():
    quick = [c for c in commands() if c.section == "Quick start" and not c.inline]
    assert [rx.classify(c).kind for c in quick] == ["install", "suite"], [c.text for c in quick]


@pytest.mark.parametrize("added", ["make bench", "dvc statsu", "python tools/setup_env.py", "spec-decode sync"])
def test_a_command_no_rule_knows_has_no_kind(added):
    text = README.replace(
        "python -m spec_decode.views.experiment headline embedded_steps_nccl ",
        f"{added}\npython -m spec_decode.views.experiment headline embedded_steps_nccl ",
        1,
    )
    new = [c for c in commands(text) if c.text == added]
    assert len(new) == 1 and new[0].section == "DVC: models, data and reported results"
    assert rx.classify(new[0]) is None


def test_a_renamed_section_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"no section\(s\) \['Quick start'\]: update SECTIONS"):
        rx.extract(README.replace("## Quick start", "## Getting started"))


def test_placeholders_are_replaced_by_stand_ins():
    text, used = rx.substitute("python -m spec_decode.views.experiment report <name>")
    assert text.endswith("report ci_smoke") and [s.placeholder for s in used] == ["<name>"]


def test_every_experiment_readme_command_has_a_kind():
    """Issue 44: the experiment READMEs' commands are extracted (each README whole) and each has a kind."""
    cmds = rx.extract_experiments(ROOT)
    assert {f"experiments/{n}/README.md" for n in ("ci_smoke", "embedded_steps_nccl", "drafter_layer_ids")} <= {
        c.section for c in cmds
    }
    kinds = {}
    for c in cmds:
        rule = rx.classify(c)
        assert rule is not None, f"{c.section}:{c.line}: {c.text!r} matches no rule in RULES"
        kinds.setdefault(rule.kind, []).append(c.text)
    # the reruns are the rebuild (git unchanged); a named `dvc repro X@Y` must run nothing in a fresh clone
    assert "python -m spec_decode.bench rebuild ci_smoke" in kinds["experiment-rebuild"]
    assert "dvc repro bench@ci_smoke report@ci_smoke" in kinds["repro-stages"]
    assert all(r.keeps_git for r in rx.RULES if r.kind == "experiment-rebuild")  # it must leave git as it was
    assert all(r.restores for r in rx.RULES if r.kind in ("repro-experiment", "repro-models", "drafter-bench"))
