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
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| call | us per call |")
    print("|---|---|")
    for name, fn in rows.items():
        print(f"| {name} | {per_call(fn):.2f} |")


if __name__ == "__main__":
    main()
