"""Overhead of the profiler plugin on a real decoding workload -- on, and installed but dormant (its
switch off, as in the timed runs) -- and that it changes no output.

    python benchmarks/profiler_overhead.py                 # CPU: host clock
    python benchmarks/profiler_overhead.py --device cuda   # GPU: CUDA events, resolved later

The embedded engine's decoder has SGLang's phase methods (cycle / draft / verify / extend); the plugin's
own ``Profiler`` hooks wrap them as it wraps EAGLEWorkerV2 / EagleDraftWorker, with its switch file
(``spec_decode.profiler.switch``) off ("dormant") or on. Variants run interleaved, their order rotated
every round; overhead = median over rounds of (tok/s plain / tok/s variant - 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_drafter, load_target
from spec_decode.engines.embedded.tokenizer import encode
from spec_decode.parsers.profile import phase_summary, rank_path, read_profile
from spec_decode.profiler.plugin import Profiler
from spec_decode.profiler.switch import set_switch

ROOT = Path(__file__).resolve().parents[1]


def hooked(dec: Decoder, path: str, switch: str) -> Decoder:
    """The plugin's own hooks on this decoder, driven by the switch file ``switch``."""
    set_switch(switch, switch.endswith(".on"))
    prof = Profiler(path, switch)
    for name in ("draft", "verify", "extend"):
        orig = getattr(dec, name)
        setattr(dec, name, (lambda o, h: lambda *a, **k: h(o, *a, **k))(orig, prof.phase(name)))
    orig_cycle = dec.cycle
    dec.cycle = lambda *a, **k: prof.around_cycle(orig_cycle, *a, **k)
    dec._prof = prof
    return dec


def host_cost_us(tmp: Path, cycles: int = 20000, repeats: int = 7) -> dict[str, float]:
    """Host time per cycle of the hooks alone, on an empty cycle (three empty phases), min over repeats:
    the decode noise of a shared machine does not reach it. µs per cycle above the bare cycle."""

    def bare_cycle(draft, verify, extend):
        draft(lambda: None)
        verify(lambda: None)
        extend(lambda: None)
        return None

    def run(prof) -> float:
        if prof is None:
            phases = [lambda f: f()] * 3
            cycle = lambda: bare_cycle(*phases)  # noqa: E731
        else:
            phases = [(lambda h: lambda f: h(f))(prof.phase(n)) for n in ("draft", "verify", "extend")]
            cycle = lambda: prof.around_cycle(bare_cycle, *phases)  # noqa: E731
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(cycles):
                cycle()
            best = min(best, time.perf_counter() - t0)
        return best / cycles * 1e6

    set_switch(tmp / "micro.off", False)
    bare = run(None)
    on = Profiler(str(tmp / "micro_on.jsonl"))  # no switch: always on (host clock here)
    out = {
        "dormant": run(Profiler(str(tmp / "micro.jsonl"), str(tmp / "micro.off"))) - bare,
        "on": run(on) - bare,
        "bare_us": bare,
    }
    on.flush()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(ROOT / "models/tiny/target", args.device)
    drafter = load_drafter(ROOT / "models/tiny/drafter", target, args.device)
    prompt = encode(json.loads((ROOT / "data/prompts.jsonl").read_text().splitlines()[0])["text"])
    tmp = Path(tempfile.mkdtemp(prefix="prof_"))
    decs = {
        "plain": Decoder(target, drafter, args.steps),
        "dormant": hooked(
            Decoder(target, drafter, args.steps), str(tmp / "dormant.jsonl"), str(tmp / "dormant.switch.off")
        ),
        "on": hooked(Decoder(target, drafter, args.steps), str(tmp / "profile.jsonl"), str(tmp / "on.switch.on")),
    }
    for d in decs.values():
        d.generate(prompt, 64)
    res: dict[str, list[float]] = {k: [] for k in decs}
    outs = {}
    names = list(decs)
    for i in range(args.rounds):
        for name in names[i % 3 :] + names[: i % 3]:  # rotated: no variant always first
            d = decs[name]
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            g = d.generate(prompt, args.tokens)
            if args.device == "cuda":
                torch.cuda.synchronize()
            res[name].append(args.tokens / (time.perf_counter() - t0))
            outs[name] = g.output_ids
    decs["on"]._prof.flush()
    assert decs["dormant"]._prof.timer is None, "the dormant profiler recorded a cycle"
    cycles = read_profile(Path(rank_path(tmp / "profile.jsonl", 0)))
    summ = phase_summary(cycles)
    print(
        f"device={args.device} threads={args.threads} steps={args.steps} tokens={args.tokens} "
        f"rounds={args.rounds} clock={type(decs['on']._prof.timer.clock).__name__} torch={torch.__version__}"
    )
    print("| variant | tok/s (median) | overhead vs plain (median of per-round ratios) |")
    print("|---|---|---|")
    for k, v in res.items():
        over = statistics.median(p / h - 1 for p, h in zip(res["plain"], v))
        print(f"| {k} | {statistics.median(v):.1f} | {100 * over:+.2f}% |")
    print(f"outputs identical: {outs['plain'] == outs['on'] == outs['dormant']}")
    micro = host_cost_us(tmp)
    for k in ("dormant", "on"):
        print(
            f"{k} hooks' host cost: {micro[k]:.2f} us per cycle above an empty cycle ({micro['bare_us']:.2f} us; "
            f"min of 7 x 20000) = {100 * micro[k] / 1e3 / summ['cycle_ms']:.3f}% of this workload's "
            f"{summ['cycle_ms']:.3f} ms cycle"
        )
    print(
        f"profile: {summ['cycles']} cycles, cycle {summ['cycle_ms']:.3f} ms = draft {summ['draft_ms']:.3f} + "
        f"verify {summ['verify_ms']:.3f} + re-extend {summ['extend_ms']:.3f} + other {summ['other_ms']:.3f}; "
        f"accept len {summ['accept_len']:.2f}"
    )


if __name__ == "__main__":
    main()
