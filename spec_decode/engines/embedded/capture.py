"""Capturing the static path's CUDA graphs safely (graphs.StaticRunner), and the fallback to eager.

At tp > 1 the target's all-reduces (``parallel.TensorParallel.reduce``) are captured inside the
graphs (NCCL). A capture of a c10d collective hangs if the communicator is created or used
differently inside the capture, so: ``init_process_group`` gets ``device_id`` (eager communicator),
every shape is first run eagerly on the capture stream (which warms NCCL on that stream), the device
is synchronised, and capture uses that same stream with ``capture_error_mode="thread_local"`` (the
c10d watchdog thread may query events meanwhile).
"""

from __future__ import annotations

import gc
import logging

import torch
import torch.distributed as dist

log = logging.getLogger("spec_decode.embedded")
WARMUP_RUNS = 2  # eager runs per shape before capture: lazy inits (cuBLAS handles, NCCL) happen here


def capture_all(fns: dict, device) -> tuple[dict[str, torch.cuda.CUDAGraph], torch.cuda.Stream]:
    """Warm every shape on the capture stream, then capture each with the garbage collector frozen
    (SGLang's ``freeze_gc``, model_executor/runner/base_cuda_graph_runner.py 47-62). Returns the
    graphs (the same order on every rank: collectives pair up) and the stream, which must live as
    long as they do.

    Why (CUBLAS_STATUS_INTERNAL_ERROR inside a capture on the H200, issue 26): torch keeps one
    cuBLAS workspace per (handle, stream), and destroying a CUDA graph clears the workspaces of the
    stream it was captured on; ``torch.cuda.Stream()`` hands out streams from a small pool, so an
    earlier runner's capture stream is often ours. Such a runner lives in a reference cycle
    (``fns`` closes over it), so it dies only in a garbage collection -- and ``torch.cuda.graph``
    runs one right before ``capture_begin``: the workspace our warmup made was freed just before
    the capture, and cuBLAS met the capture without one. So: collect first (dead graphs go now),
    warm up and synchronise, and keep collections out of the capture window."""
    gc.collect()
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for fn in fns.values():  # on the capture stream: NCCL and cuBLAS warm up there
            for _ in range(WARMUP_RUNS):
                fn()
    torch.cuda.synchronize(device)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    gc.freeze()  # torch.cuda.graph's own gc.collect() then finds no earlier runner to destroy
    try:
        for name, fn in fns.items():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                fn()
            torch.cuda.synchronize(device)
            graphs[name] = graph
    finally:
        gc.unfreeze()
    return graphs, stream


def describe_failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def end_generator_capture(device) -> None:
    """A capture that raised in ``capture_end`` never ran the CUDA generators' capture epilogue: they
    still think they are capturing, and the process's next eager random op fails ("Offset increment
    outside graph capture encountered unexpectedly"). One empty capture runs prologue and epilogue."""
    try:
        with torch.cuda.device(device):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
    except RuntimeError as e:  # the eager fallback stands either way; only random ops are affected
        log.warning("could not reset the CUDA generators after the failed capture: %s", e)


def all_ranks_captured(ok: bool, group=None) -> bool:
    """At tp > 1: whether every rank captured (MIN over a CPU group); True outside a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(int(flag))


def capture_or_fall_back(runner) -> None:
    """Capture a ``graphs.StaticRunner``'s shapes; a capture that fails leaves the runner eager (same
    kernels, same output), said in the log and in ``runner.capture_error`` (the rank reports it:
    /server_info ``cuda_graph_error``). Every rank then agrees (``StaticRunner.agree_on_graphs``) so that
    no rank replays while another runs eagerly."""
    try:
        runner.graphs, runner.capture_stream = capture_all(runner.fns, runner.device)
        log.info(
            "captured %d CUDA graphs for batch sizes %s: %s", len(runner.graphs), runner.sizes, ", ".join(runner.graphs)
        )
    except RuntimeError as e:
        runner.graphs = {}
        runner.use_graphs = False
        runner.capture_error = describe_failure(e)
        torch.cuda.synchronize(runner.device)
        end_generator_capture(runner.device)
        log.error(
            "CUDA graph capture failed (%s); running the static shapes eagerly "
            "(--disable-cuda-graph behaviour; same output, slower)",
            runner.capture_error,
        )
