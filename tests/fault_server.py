"""A fault-injecting wrapper around the embedded engine, at the process boundary (for tests only).

    python tests/fault_server.py <embedded engine flags>      with FAULT=<mode> in the environment

Modes (FAULT_IF_ARG="--flag:value" applies the fault only to servers launched with that flag value;
FAULT_COUNTER=<file> with mode every:N:<inner> applies <inner> to every N-th server started):
  start_crash        print a line and exit 3 before listening
  die_on_request:K   SIGKILL itself when the K-th /generate arrives (warmup counts)
  hang_on_request:K  SIGSTOP itself when the K-th /generate arrives
  drop_profile       start the engine without SPEC_DECODE_PROFILE (profile plugin "not loadable")
  drop_nccl          re-exec without any NCCL_* variable (a launch that lost its tuning)
  corrupt_output:K   change the K-th generated token id of every /generate answer and stream event (a
                     speculative engine that is not lossless, for the lossless guard)
  slow:F             busy-wait after every /generate for F/(1-F) x the time it took, so this server's
                     tok/s is (1-F) x its own whatever the host's load (a planted bias: A/A control, compare)
FAULT_IF_ENV=NAME applies the fault only to servers whose environment holds NAME (e.g. NCCL_PROTO: the
nccl=tuned servers).
FAULT_GRANDCHILD=1 also starts a `sleep` grandchild, as SGLang's scheduler subprocesses would be.
"""

import os
import runpy
import signal
import subprocess
import sys
import time


def applies(argv: list[str]) -> bool:
    if (need := os.environ.get("FAULT_IF_ENV")) and need not in os.environ:
        return False
    cond = os.environ.get("FAULT_IF_ARG")
    if not cond:
        return True
    flag, value = cond.split(":", 1)
    return any(a == flag and i + 1 < len(argv) and argv[i + 1] == value for i, a in enumerate(argv))


def mode_for_this_server(argv: list[str]) -> str:
    mode = os.environ.get("FAULT", "")
    if not applies(argv):
        return ""
    if mode.startswith("every:"):
        _, n, inner = mode.split(":", 2)
        path = os.environ["FAULT_COUNTER"]
        with open(path, "a+") as f:
            f.seek(0)
            count = len(f.read()) + 1
            f.write("x")
        return inner if count % int(n) == 0 else ""
    return mode


def main() -> None:
    argv = sys.argv[1:]
    mode = mode_for_this_server(argv)
    if mode == "drop_nccl" and any(k.startswith("NCCL_") for k in os.environ):
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        os.execve(sys.executable, [sys.executable, __file__, *argv], env)
    if os.environ.get("FAULT_GRANDCHILD"):
        subprocess.Popen(["sleep", "600"])
    if mode == "start_crash":
        print("fault: crashing on start (injected)", flush=True)
        raise SystemExit(3)
    if mode == "drop_profile":
        os.environ.pop("SPEC_DECODE_PROFILE", None)
    if mode.startswith(("die_on_request:", "hang_on_request:")):
        kind, k = mode.split(":")
        from spec_decode.engines.embedded import server

        seen = {"n": 0}

        def counted(original):
            def call(self, arg):
                seen["n"] += 1
                if seen["n"] == int(k):
                    print(f"fault: {kind} at request {seen['n']} (injected)", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL if kind == "die_on_request" else signal.SIGSTOP)
                return original(self, arg)

            return call

        # a /generate request reaches one of them: generate (JSON answer) or stream (SSE events)
        for name in ("generate", "stream"):
            if hasattr(server.EngineState, name):
                setattr(server.EngineState, name, counted(getattr(server.EngineState, name)))
    if mode.startswith("corrupt_output:"):
        from spec_decode.engines.embedded import server

        pos = int(mode.split(":")[1])

        def corrupt(out):
            if isinstance(out, dict) and len(out.get("output_ids") or []) > pos:
                out["output_ids"][pos] = (out["output_ids"][pos] + 1) % 256
            return out

        plain = server.EngineState.generate
        server.EngineState.generate = lambda self, arg: corrupt(plain(self, arg))
        if hasattr(server.EngineState, "stream"):  # every event carries the ids so far (cumulative)
            events = server.EngineState.stream
            server.EngineState.stream = lambda self, arg: (corrupt(ev) for ev in events(self, arg))
    if mode.startswith("slow:"):
        from spec_decode.engines.embedded import server

        frac = float(mode.split(":")[1])
        plain_generate = server.EngineState.generate

        def slowed(self, arg):
            t0 = time.perf_counter()
            out = plain_generate(self, arg)
            until = time.perf_counter() + (time.perf_counter() - t0) * frac / (1 - frac)
            while time.perf_counter() < until:  # busy: it takes CPU like real work would
                pass
            return out

        server.EngineState.generate = slowed
    sys.argv = ["spec_decode.engines.embedded", *argv]
    runpy.run_module("spec_decode.engines.embedded", run_name="__main__")


if __name__ == "__main__":
    main()
