"""Run one of SGLang 0.5.23's own client tools (``python -m sglang.bench_serving`` and the like) on this
CPU machine, where the contract tier installs the sglang package without its GPU stack:

    python tests/sglang_client.py sglang.bench_serving --backend sglang --base-url http://... ...

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

import runpy
import sys
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


def main() -> None:
    from torch.utils._triton import has_triton_package  # functools.cache: probed once, before the stub

    assert not has_triton_package(), "a real triton is installed: run the tool directly"
    sys.path.insert(0, str(STUBS))
    _stand_in("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST=FAKE_BOOTSTRAP_HOST)
    _stand_in("sglang.srt.entrypoints.http_server", launch_server=_no_server)
    from sglang.srt.server_args import ServerArgs

    ServerArgs.resolve_once = lambda self, *a, **k: None
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
