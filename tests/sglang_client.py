"""Run one of SGLang 0.5.23's own client tools (``python -m sglang.bench_serving`` and the like) on this
CPU machine, where the contract tier installs the sglang package without its GPU stack:

    python tests/sglang_client.py sglang.bench_serving --backend sglang --base-url http://... ...
    python tests/sglang_client.py --serve   # the tests: one tool per stdin line, SGLang imported once

The tools' HTTP code runs unchanged; only imports they make but never call against a running server
(``--base-url``) are stood in, each named here:

- triton: sglang's ``srt/utils/common.py`` imports it bare; the contract tier's stub (tests/contract/
  stubs) answers that, after torch was told there is no triton (its cached probe), so that torch's
  compiler does not take the stub for a real triton when transformers imports it;
- ``sglang.srt.disaggregation.utils``: bench_serving imports it for one string (FAKE_BOOTSTRAP_HOST,
  used only with --fake-prefill), and the module drags in the whole GPU server stack;
- ``sglang.srt.entrypoints.http_server``: bench_one_batch_server imports ``launch_server``, called only
  without --base-url; here it raises;
- ``ServerArgs.resolve_once``: bench_one_batch_server resolves the server's arguments (the model's
  config through the GPU stack) before it looks at --base-url; the resolved values are used only to
  launch a server of its own.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import traceback
import types
from pathlib import Path

STUBS = Path(__file__).parent / "contract" / "stubs"
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang/srt/disaggregation/utils.py 53 (0.5.23)


def _stand_in(name: str, **attrs) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def _no_server(*args, **kwargs):
    raise RuntimeError("tests/sglang_client.py: this client may not launch a server here; give it --base-url")


# what --serve imports before its first request, so that each tool's process starts with them loaded
TOOLS = ("sglang.bench_serving", "sglang.bench_one_batch_server", "sglang.test.send_one")


def _prepare() -> None:
    from torch.utils._triton import has_triton_package  # functools.cache: probed once, before the stub

    assert not has_triton_package(), "a real triton is installed: run the tool directly"
    sys.path.insert(0, str(STUBS))
    _stand_in("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST=FAKE_BOOTSTRAP_HOST)
    _stand_in("sglang.srt.entrypoints.http_server", launch_server=_no_server)
    from sglang.srt.server_args import ServerArgs

    ServerArgs.resolve_once = lambda self, *a, **k: None


def _run_tool(module: str, args: list[str]) -> None:
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def serve() -> None:
    """The tests' mode: SGLang and its tools are imported once (~4.5 s of CPU each time otherwise), then per
    stdin line ``{"module", "args", "cwd", "stdout", "stderr", "timeout_s"}`` a forked child runs the tool as
    ``python tests/sglang_client.py MODULE ARGS`` would (its own process, cwd and fresh ``__main__``; its
    stdout and stderr into those files); the answer is one ``TOOL_EXIT <code>`` line."""
    _prepare()
    for m in TOOLS:
        importlib.import_module(m)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for target, name in ((1, "stdout"), (2, "stderr")):
                    os.dup2(os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), target)
                os.chdir(req["cwd"])
                signal.alarm(int(req.get("timeout_s", 300)))  # a hung tool dies (SIGALRM): its exit says so
                _run_tool(req["module"], req["args"])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 -- the tool's traceback goes to its output, as run alone
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"TOOL_EXIT {os.waitstatus_to_exitcode(status)}", flush=True)


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    _prepare()
    _run_tool(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
