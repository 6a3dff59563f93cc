"""First-contact self-check: is this install and this server able to give trustworthy numbers?

    python -m spec_decode.runner.doctor [hydra overrides]          # e.g. engine=sglang hardware=h200x8 ...
    python -m spec_decode.runner.doctor --static-only [overrides]  # no server: install and hook checks

Static items (no server): the installed engine version; our profiler's entry point in the
``sglang.srt.plugins`` group (and not excluded by ``SGLANG_PLUGINS``); every hook target resolves to a
real method of the installed engine with a compatible signature (read from SGLang's source with
``ast``, so no GPU import is needed). Live items (one short request to the launched server, which is
then stopped with SIGTERM as the runner does): profile lines from rank 0 with all three phases, one
cycle per verify; ``meta_info`` speculative counters; ``Decode batch`` lines that our parser reads.

An ``engine=sglang`` job runs the static items as part of preflight and the live items on its own
warmup request (results.json ``doctor``). Each failed item says what is missing and what to do.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import pkgutil
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from spec_decode import __version__
from spec_decode.core.config import ConfigError, register_configs, to_experiment
from spec_decode.core.overrides import check_argv
from spec_decode.core.prompts import load_prompts
from spec_decode.engines import server_extra_env, start_server
from spec_decode.engines.engine import named
from spec_decode.engines.server_process import ServerError
from spec_decode.parsers import decode_log, profile
from spec_decode.profiler.plugin import TARGETS
from spec_decode.record.payloads import DoctorItem
from spec_decode.runner.client import Client

ENTRY_POINT = "spec_decode_profiler"
# The leading parameters each hooked method must take (our hooks pass *args through, but the phase
# meaning depends on them: batch in, verify result into the re-extend).
SIGNATURES = {
    "sglang": {
        "forward_batch_generation": ["self", "batch"],
        "draft": ["self", "batch"],
        "verify": ["self", "batch"],
        "_draft_extend_for_decode": ["self", "batch", "batch_result"],
    },
    # our Decoder takes SGLang's batch in every hooked method (docs/embedded-engine.md, hook contract)
    "embedded": {
        "cycle": ["self", "batch"],
        "draft": ["self", "batch"],
        "verify": ["self", "batch"],
        "extend": ["self", "batch"],
    },
}

PROFILE_ITEM = "profile from rank 0"  # the live item that waits for the profile's flush
LOG_LAG_S = 0.05  # a log line written before the answer reaches server.log within this (as runner.job)


NO_SGLANG = "sglang is not installed (pip install -e '.[sglang]')"


Item = DoctorItem  # an item of the self-check: the record's type (the live ones are the record's doctor)


def check_version(engine: str, v: str | None = None) -> Item:
    """The installed engine (or ``v``) against the engine's supported releases (``Engine.version_error``;
    SGLang's table: engines.sglang.SUPPORTED)."""
    eng = named(engine)
    if not eng.external:
        return Item("engine version", True, f"{eng.name} engine of spec-decode-bench {__version__}")
    v = v or eng.installed_version()
    if v is None:
        return Item("engine version", False, NO_SGLANG, "pip install -e '.[sglang]' on the GPU box")
    supported = ", ".join(eng.supported_versions)
    if eng.version_error(v) is None:
        return Item("engine version", True, f"{eng.name} {v} (supported: {supported})")
    return Item("engine version", False, f"{eng.name} {v} is not supported (supported: {supported})", eng.install_hint)


def check_entry_point(entry_points: list, allowed: str | None) -> Item:
    """Our plugin among the ``sglang.srt.plugins`` entry points, and allowed by SGLANG_PLUGINS."""
    ours = [ep for ep in entry_points if ep.name == ENTRY_POINT]
    if not ours:
        names = ", ".join(sorted(ep.name for ep in entry_points)) or "none"
        return Item(
            "profiler plugin installed",
            False,
            f"no `{ENTRY_POINT}` entry point in group sglang.srt.plugins (found: {names})",
            "pip install -e . in the environment that runs the server (the entry point "
            "comes from our package's metadata)",
        )
    names = {n.strip() for n in (allowed or "").split(",") if n.strip()}
    if names and ENTRY_POINT not in names:
        return Item(
            "profiler plugin installed",
            False,
            f"`{ENTRY_POINT}` is installed but SGLANG_PLUGINS={allowed!r} excludes it",
            f"add {ENTRY_POINT} to SGLANG_PLUGINS, or unset it",
        )
    return Item("profiler plugin installed", True, f"{ours[0].value} (group sglang.srt.plugins)")


def _sglang_source(module: str, root: Path | None = None) -> Path | None:
    """``module``'s file in the installed sglang, or under ``root`` (a directory holding ``sglang/``)."""
    if root is not None:
        return root / (module.replace(".", "/") + ".py")
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(list(spec.submodule_search_locations)[0]).parent
    return base / (module.replace(".", "/") + ".py")


def _params_from_source(target: str, root: Path | None = None) -> list[str] | str:
    """A method's parameter names, read from the installed SGLang source (or ``root``'s); or why it is not there."""
    module, cls, meth = target.rsplit(".", 2)
    source = _sglang_source(module, root)
    if source is None or not source.exists():
        return f"{module} is not installed"
    classes = {n.name: n for n in ast.parse(source.read_text()).body if isinstance(n, ast.ClassDef)}
    if cls not in classes:
        return f"class {cls} not in {source}"
    methods = {n.name: n for n in classes[cls].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if meth not in methods:
        return f"{cls}.{meth} not in {source}"
    return [a.arg for a in methods[meth].args.args]


def _params_from_import(target: str) -> list[str] | str:
    owner_path, meth = target.rsplit(".", 1)
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError) as e:
        return f"{owner_path} does not import ({e})"
    fn = getattr(owner, meth, None)
    if fn is None:
        return f"{owner_path}.{meth} does not exist"
    fn = inspect.unwrap(fn)
    return list(inspect.signature(fn).parameters)


def check_hook_targets(engine: str, targets=None, root: Path | None = None) -> Item:
    """``root``: read SGLang's source from this directory (holding ``sglang/``) instead of the installed one."""
    targets = TARGETS[engine] if targets is None else targets
    eng = named(engine)
    external = eng.external  # read from its installed source (or root's), not imported (seconds)
    if external and root is None and importlib.util.find_spec(str(eng.package)) is None:  # absent, not moved
        return Item("hook targets", False, NO_SGLANG, "pip install -e '.[sglang]' on the GPU box")
    problems = []
    for target, _ in targets:
        params = _params_from_source(target, root) if external else _params_from_import(target)
        if isinstance(params, str):
            problems.append(params)
            continue
        want = SIGNATURES[engine].get(target.rsplit(".", 1)[1], ["self"])
        if params[: len(want)] != want:
            problems.append(f"{target}({', '.join(params)}): expected parameters starting {want}")
    if problems:
        return Item(
            "hook targets",
            False,
            "; ".join(dict.fromkeys(problems)),  # a module that is absent: once, not once per target
            "the installed engine moved its EAGLE-3 phases: update TARGETS in "
            "spec_decode/profiler/plugin.py for this version (or install the tested one)",
        )
    return Item("hook targets", True, f"{len(targets)} targets resolve ({engine})")


def static_checks(engine: str) -> list[Item]:
    return [
        check_version(engine),
        check_entry_point(list(entry_points(group="sglang.srt.plugins")), os.environ.get("SGLANG_PLUGINS")),
        check_hook_targets(engine),
    ]


def live_checks(
    profile_path: Path,
    window: tuple[float, float],
    meta: dict,
    log_lines: list[str],
    speculative: bool = True,
    log_interval: int | None = None,
) -> list[Item]:
    """After one request (its wall-clock window, its meta_info, the server log lines meanwhile) and
    after the profile's flush (idle or SIGTERM). ``log_interval``: the server's engine.decode_log_interval."""
    items = []
    if speculative:
        ranks = profile.read_ranks(profile_path)
        cycles = profile.in_windows(ranks.get(0, []), [window])[0]
        verify_ct = meta.get("spec_verify_ct")
        if not cycles:
            where = (
                f"found ranks {sorted(ranks)}"
                if ranks
                else f"no {Path(profile.rank_path(profile_path, 0)).name} at all"
            )
            items.append(
                Item(
                    PROFILE_ITEM,
                    False,
                    f"no profile lines in the request's window ({where})",
                    "the plugin did not run in the rank processes: check the items above, "
                    "SPEC_DECODE_PROFILE in the server env (benchmark.profile=true) and the "
                    "server log for 'spec_decode profiler'",
                )
            )
        else:
            phases = [p for p in ("draft", "verify", "extend") if not any(c.get(f"{p}_ms", 0) > 0 for c in cycles)]
            # One request: its counted verifies, plus at most one in-flight cycle after its finishing
            # result under the overlap scheduler (SGLang's default and ours; not counted in meta_info).
            ok = not phases and (verify_ct is None or verify_ct <= len(cycles) <= verify_ct + 1)
            detail = f"{len(cycles)} cycles from rank 0 (ranks with files: {sorted(ranks)})"
            if phases:
                detail += f"; phases never timed: {phases}"
            if verify_ct is not None and not verify_ct <= len(cycles) <= verify_ct + 1:
                detail += f"; but meta_info says {verify_ct} verifies (+ at most 1 in-flight cycle)"
            items.append(
                Item(
                    PROFILE_ITEM,
                    ok,
                    detail,
                    ""
                    if ok
                    else "a hook target is not called on this engine's path "
                    "(check the hook targets item and the server log)",
                )
            )
        counters = [k for k in ("spec_verify_ct", "completion_tokens") if meta.get(k) is None]
        items.append(
            Item(
                "meta_info spec counters",
                not counters,
                f"missing {counters}"
                if counters
                else f"spec_verify_ct={meta['spec_verify_ct']}, completion_tokens={meta.get('completion_tokens')}",
                ""
                if not counters
                else "speculation is not on in this server: check the --speculative-* flags in server.log",
            )
        )
    items.append(decode_log_item(log_lines, meta, speculative, log_interval))
    return items


def decode_log_item(log_lines: list[str], meta: dict, speculative: bool, log_interval: int | None) -> Item:
    """``Decode batch`` lines in the request's window: due only where the request ran at least
    ``log_interval`` decode batches (one per verify; one per token after the first without speculation).
    The server writes one every ``engine.decode_log_interval`` batches, counted across requests, so fewer
    batches may write none (a 32-token warmup at 3 steps: 8 verifies < 10); an unknown interval: due."""
    decodes = [x for x in decode_log.parse_lines(log_lines) if x.kind == "Decode"]
    if decodes:
        return Item("decode-log lines", True, f"{len(decodes)} `Decode batch` lines parsed")
    done = meta.get("completion_tokens")
    batches = meta.get("spec_verify_ct") if speculative else (done - 1 if done else None)
    if log_interval is not None and batches is not None and batches < log_interval:
        return Item(
            "decode-log lines",
            True,
            f"none due: {batches} decode batches < engine.decode_log_interval={log_interval}",
        )
    ran = f" ({batches} decode batches, engine.decode_log_interval={log_interval})" if log_interval else ""
    return Item(
        "decode-log lines",
        False,
        f"no `Decode batch` line our parser reads{ran}",
        "lower engine.decode_log_interval below the request's decode batches; if server.log has "
        "`Decode batch` lines, our parser does not read this version's: send a golden sample to tests/data/logs",
    )


def render(items: list[Item]) -> str:
    lines = []
    for it in items:
        lines.append(f"[{'OK' if it.ok else 'FAIL'}] {it.name}: {it.detail}")
        if not it.ok and it.fix:
            lines.append(f"       what to do: {it.fix}")
    bad = sum(not it.ok for it in items)
    lines.append(f"{len(items) - bad} passed, {bad} failed")
    return "\n".join(lines)


def request_checks(
    run, profile_path: Path, log_path: Path, log_start: int, speculative: bool, log_interval: int | None = None
) -> list[Item]:
    """The live items for one measured request (a client.RunRecord): its window in the profile, its
    meta_info counters, the server log written since ``log_start``. ``log_interval``: the job's
    engine.decode_log_interval (None: unknown, a line is due)."""
    with open(log_path, "rb") as f:
        f.seek(log_start)
        lines = f.read().decode(errors="replace").splitlines()
    meta = {"spec_verify_ct": run.spec_verify_ct, "completion_tokens": run.completion_tokens}
    return live_checks(profile_path, (run.start_wall, run.end_wall), meta, lines, speculative, log_interval)


def warmup_checks(
    warmup,
    profile_path: Path,
    log_path: Path,
    log_start: int,
    speculative: bool,
    log_interval: int | None = None,
    wait_s: float = 1.0,
    poll_s: float = 0.02,
) -> list[Item]:
    """The live items on a job's own warmup request (no extra server, no extra request). The plugin's
    flusher writes completed cycles within 50 ms of idle: asked again every ``poll_s`` while the profile
    item fails, for at most ``wait_s``; the other items read lines the server wrote before it answered
    (``LOG_LAG_S`` for them to reach the file). A fixed 0.3 s sleep here was a fifth of a sweep job's
    harness time (docs/benchmarks.md)."""
    deadline = time.monotonic() + wait_s
    while True:
        items = request_checks(warmup, profile_path, log_path, log_start, speculative, log_interval)
        flushed = all(it.ok for it in items if it.name == PROFILE_ITEM)
        if (flushed and time.time() - warmup.end_wall >= LOG_LAG_S) or time.monotonic() >= deadline:
            return items
        time.sleep(poll_s)


def run(overrides: list[str], root: Path, static_only: bool = False, max_new_tokens: int = 96) -> list[Item]:
    """Compose the job's config, run the static items, then (unless static_only) launch the server,
    send one request, stop the server with SIGTERM and run the live items."""
    register_configs()
    with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
        cfg = to_experiment(compose("config", overrides=overrides))
    items = static_checks(cfg.engine.name)
    if static_only:
        return items
    if named(cfg.engine.name).installed_version() is None:  # nothing to launch: say so, no traceback
        return items + [
            Item(
                "live request",
                False,
                "not run: sglang is not installed, so no server can start",
                "pip install -e '.[sglang]' on the GPU box, or --static-only here",
            )
        ]
    prompt = load_prompts(root / cfg.benchmark.prompts)[cfg.benchmark.prompt_index]
    with tempfile.TemporaryDirectory(prefix="spec_decode_doctor_") as tmp:
        prof, log_path = Path(tmp) / "profile.jsonl", Path(tmp) / "server.log"
        try:
            srv = start_server(cfg, server_extra_env(cfg, str(prof)), log_path)
        except ServerError as e:  # the server's own last lines say why
            return items + [
                Item("live request", False, f"not run: {e}", "fix what the server log says, then run the doctor again")
            ]
        try:
            client = Client(srv.base_url, cfg.engine.request_timeout_s)
            start = log_path.stat().st_size
            one = client.generate(client.generate_body(prompt, max_new_tokens, 0.0, True), 0, 0)
        finally:
            srv.stop()  # SIGTERM first: the plugin writes what it holds
        items += request_checks(one, prof, log_path, start, cfg.speculative, cfg.engine.decode_log_interval)
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m spec_decode.runner.doctor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--static-only", action="store_true", help="no server: install and hook checks only")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py (engine=sglang ...)")
    args = p.parse_args(argv)
    try:  # bad overrides as run.py answers them: the key named, exit 2, no traceback
        check_argv(args.overrides)
        items = run(args.overrides, Path.cwd(), static_only=args.static_only)
    except (ConfigError, HydraException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(items))
    return 0 if all(it.ok for it in items) else 1


if __name__ == "__main__":
    sys.exit(main())
