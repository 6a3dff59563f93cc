"""Host cost of the CUDA calls the profiler makes (event create / record / query / elapsed_time).

python benchmarks/cuda_event_cost.py     # on a GPU box; prints microseconds per call
"""

import time

import torch


def per_call(fn, n=2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    assert torch.cuda.is_available()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    b.record()
    torch.cuda.synchronize()
    x = torch.zeros(16, device="cuda")
    rows = {
        "Event(enable_timing=True)": lambda: torch.cuda.Event(enable_timing=True),
        "event.record()": lambda: a.record(),
        "event.query()": lambda: b.query(),
        "a.elapsed_time(b)": lambda: a.elapsed_time(b),
        "tiny kernel launch (x.add_(1))": lambda: x.add_(1),
        "time.perf_counter()": time.perf_counter,
    }
    import tempfile

    from spec_decode.profiler.timer import CudaClock, HostClock, PhaseTimer

    class Out:
        accept_lens = [3]

    def make_cycle(timer):
        draft, verify, extend = (timer.phase(n) for n in ("draft", "verify", "extend"))

        def body():
            draft(x.add_, 1)
            verify(x.add_, 1)
            extend(x.add_, 1)
            return Out()

        return lambda: timer.around_cycle(body)

    def plain_body():
        x.add_(1)
        x.add_(1)
        x.add_(1)
        return Out()

    tmp = tempfile.mkdtemp()
    cuda_timer = PhaseTimer(f"{tmp}/c.jsonl", clock=CudaClock(torch))
    host_timer = PhaseTimer(f"{tmp}/h.jsonl", clock=HostClock())
    rows["cycle of 3 tiny kernels, no timer"] = plain_body
    rows["same cycle + PhaseTimer (CUDA events)"] = make_cycle(cuda_timer)
    rows["same cycle + PhaseTimer (host clock)"] = make_cycle(host_timer)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| call | us per call |")
    print("|---|---|")
    for name, fn in rows.items():
        print(f"| {name} | {per_call(fn):.2f} |")
    cuda_timer.drain(wait=True)


if __name__ == "__main__":
    main()
