"""python -m spec_decode.engines.embedded [SGLang-style flags]

Our CPU (or CUDA) inference server for the tiny Llama target and its EAGLE-3 drafter. It takes
SGLang 0.5.23's flag names for what it supports and refuses unknown flags (exit 2, flag named).
Without speculative flags it is the baseline engine (plain greedy decoding).

Processes, as SGLang's: this one (the front) serves HTTP and spawns one rank process per
--tp-size rank (torch.distributed: gloo on CPU, NCCL on CUDA with rank r on cuda:r); the target is
sharded Megatron-style across the ranks, the drafter replicated. Rank 0 writes the `Decode batch`
lines. With SPEC_DECODE_PROFILE set, the profiler plugin (loaded in every process) writes one
profile file per rank. See docs/embedded-engine.md.

Environment (SGLang 0.5.23's names and semantics): SGLANG_SIMULATE_ACC_LEN=<x> forces every verify
to commit floor(x) or floor(x)+1 tokens (bonus included; mean x) whatever the target says --
performance work only, outputs are not lossless; SGLANG_SIMULATE_ACC_METHOD (match-expected |
multinomial), SGLANG_SIMULATE_ACC_TOKEN_MODE (fixed: token id 100 | real-draft-token).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
from pathlib import Path

from spec_decode.engines.embedded.server_args import RankSpec, SimulatedAcceptance, tp_size_error

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(  # allow_abbrev off: --cuda-graph-max-bs is not a prefix of a flag here
        allow_abbrev=False,
        prog="python -m spec_decode.engines.embedded",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-path", "--model", required=True, help="target model directory (HF Llama)")
    p.add_argument("--speculative-algorithm", default=None, help="EAGLE3, or omit for the baseline")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None, help="draft depth k")
    p.add_argument("--speculative-eagle-topk", type=int, default=None, help="only 1 (chain) is supported")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None, help="k + 1 for topk 1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="rank processes; must divide the target's attention heads, kv heads and intermediate size",
    )
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="on --device cuda: run decode/draft/verify/extend eagerly instead of replaying "
        "CUDA graphs (same kernels, same output; CPU never uses graphs)",
    )
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=16,
        help="requests decoded together in the running batch; the rest wait in the queue "
        "(SGLang's flag; also the static path's request slots)",
    )
    p.add_argument(
        "--cuda-graph-max-bs-decode",
        type=int,
        default=None,
        help="the static path's largest CUDA-graph batch size (SGLang 0.5.23's flag): graphs for "
        "the buckets 1, 2, 4, 8, 16, 24, ... up to it, a batch runs padded to its bucket, and "
        "larger batches run the same shapes eagerly; default and cap: --max-running-requests",
    )
    p.add_argument(
        "--static-path",
        action="store_true",
        help="test and debugging only: on --device cpu, decode on the static path's shapes "
        "(request slots, batch-size buckets) eagerly, as --device cuda --disable-cuda-graph does",
    )
    p.add_argument(
        "--cuda-eager-batching",
        action="store_true",
        help="on --device cuda: decode on the packed eager path (continuous batching up to "
        "--max-running-requests, no static buffers, no CUDA graphs) instead of the static path",
    )
    p.add_argument(
        "--enable-torch-compile",
        action="store_true",
        help="the static path (--device cuda, or --static-path): each static shape through torch.compile "
        "before its graph is captured (SGLang's flag name): fused elementwise kernels, a slower start-up",
    )
    p.add_argument(
        "--proj-split",
        type=int,
        default=0,
        metavar="N",
        help="with --enable-torch-compile (the static path, tp 1): o_proj and down_proj as N >= 2 fp32 partials "
        "whose sum torch.compile reads inside the next fused norm, in place of cuBLAS's split-K reduce kernels; "
        "N must divide both input widths (hidden size and MLP width); 0 (the default): one GEMM each",
    )
    p.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="process each batch's result before the next batch is scheduled (SGLang's flag); "
        "by default the next batch is launched first (the overlap scheduler)",
    )
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=1,
        help="torch threads (tiny models decode fastest on 1: per-op overhead dominates)",
    )
    p.add_argument("--log-level", default="info")
    return p


def resolve_spec(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """SGLang's rules: all three spec numbers or none; topk 1 forces draft tokens = steps + 1."""
    trio = [args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens]
    if args.speculative_algorithm is None:
        if any(v is not None for v in trio) or args.speculative_draft_model_path:
            parser.error("speculative flags given without --speculative-algorithm EAGLE3")
        return
    if args.speculative_algorithm.upper() != "EAGLE3":
        parser.error(f"--speculative-algorithm {args.speculative_algorithm}: only EAGLE3 is supported")
    args.speculative_algorithm = "EAGLE3"
    if any(v is None for v in trio):
        parser.error(
            "set all of --speculative-num-steps, --speculative-eagle-topk and "
            "--speculative-num-draft-tokens, or none (SGLang asserts the same)"
        )
    if not args.speculative_draft_model_path:
        parser.error("--speculative-draft-model-path is required with --speculative-algorithm EAGLE3")
    if args.speculative_num_steps < 1:
        parser.error(f"--speculative-num-steps must be >= 1 (got {args.speculative_num_steps})")
    if args.speculative_eagle_topk != 1:
        parser.error(
            f"--speculative-eagle-topk {args.speculative_eagle_topk}: the embedded engine drafts chains only (topk 1)"
        )
    if args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
        logging.warning(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
        )
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1


def resolve_seed_and_forcing(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """SGLang's rules: no --random-seed means a random one (drawn once, here, so every rank shares
    it); SGLANG_SIMULATE_ACC_LEN > 0 forces acceptance with speculation (exit 2 on a bad value)."""
    if args.random_seed is None:
        args.random_seed = random.randint(0, 1 << 30)
    try:
        forced = SimulatedAcceptance.from_env()
    except ValueError as e:
        parser.error(str(e))
    if forced is not None and args.speculative_algorithm:
        logging.warning("%s", forced.describe())


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def check_models(args: argparse.Namespace) -> list[int] | None:
    """Start-up checks that SGLang would also fail on, with a message that says what to do: the drafter
    rules are spec_decode.core.drafter's (the ones preflight applies), plus what only this engine needs.
    Returns the drafter's layer ids as it will be served (None for the baseline)."""
    from spec_decode.core import drafter as rules  # lazy: start-up, only with a drafter to check
    from spec_decode.core.shapes import proj_split_problem

    target = Path(args.model_path)
    if not (target / "config.json").is_file() or not (target / "model.safetensors").is_file():
        fail(
            f"--model-path {target}: no config.json/model.safetensors there "
            f"(run `dvc pull {target}` or `dvc repro` to build the tiny models)"
        )
    try:
        tcfg = rules.read_config(target / "config.json")
    except ValueError as e:
        fail(str(e))
    if why := proj_split_problem(args.proj_split, rules.language_model(tcfg)):
        fail(f"--proj-split {args.proj_split}: {why}")
    if not args.speculative_algorithm:
        return None
    draft = Path(args.speculative_draft_model_path)
    if not (draft / "config.json").is_file() or not (draft / "model.safetensors").is_file():
        fail(f"--speculative-draft-model-path {draft}: no config.json/model.safetensors there (run `dvc pull {draft}`)")
    where = draft / "config.json"
    try:
        dcfg = rules.read_config(where)
    except ValueError as e:
        fail(str(e))
    errors = rules.problems(dcfg, tcfg, str(where))
    # This engine gives the drafter the target's embedding (as SGLang's set_embed does), so the
    # drafter's own width must be the target's too.
    if not errors and dcfg.get("hidden_size") != tcfg["hidden_size"]:
        errors.append(
            f"{where}: hidden_size {dcfg.get('hidden_size')} must equal the target's "
            f"{tcfg['hidden_size']} (the embedded engine shares the target's embedding)"
        )
    if errors:
        fail(
            f"--speculative-draft-model-path {draft} cannot serve --model-path {target}:\n  - "
            + "\n  - ".join(errors)
            + "\nwhat to do: serve the drafter built for this target (models/tiny/drafter, `dvc repro "
            "drafter`) or fix the drafter's config.json"
        )
    return rules.served_layer_ids(dcfg, tcfg["num_hidden_layers"])


def check_tp_size(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--tp-size must shard the target evenly (exit 2 naming the flag and the head counts)."""
    cfg = json.loads((Path(args.model_path) / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    err = tp_size_error(args.tp_size, heads, kv_heads, cfg["intermediate_size"])
    if err:
        parser.error(err)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_spec(args, parser)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )
    if args.proj_split < 0 or args.proj_split == 1:
        parser.error(f"--proj-split must be 0 (off) or >= 2 (got {args.proj_split}; 1 would be the one GEMM)")
    if args.proj_split > 1 and not args.enable_torch_compile:
        parser.error(
            f"--proj-split {args.proj_split} needs --enable-torch-compile: torch.compile fuses the partials' sum"
        )
    if args.max_running_requests < 1:
        parser.error(f"--max-running-requests must be >= 1 (got {args.max_running_requests})")
    if args.cuda_graph_max_bs_decode is not None and args.cuda_graph_max_bs_decode < 1:
        parser.error(f"--cuda-graph-max-bs-decode must be >= 1 (got {args.cuda_graph_max_bs_decode})")
    if args.enable_torch_compile and not ((args.device == "cuda" and not args.cuda_eager_batching) or args.static_path):
        parser.error(
            "--enable-torch-compile compiles the static path's shapes: it needs --device cuda without "
            "--cuda-eager-batching (or --static-path on CPU)"
        )
    if args.enable_torch_compile and args.tp_size > 1:
        parser.error("--enable-torch-compile: not tested at --tp-size > 1 yet (all-reduces inside the compiled shapes)")
    # the flags alone first, then what needs the model's config.json (the split's widths, the tp shards)
    layer_ids = check_models(args)
    check_tp_size(args, parser)
    resolve_seed_and_forcing(args, parser)

    # Imported only now: a bad flag or model exits above without loading the HTTP side (its imports).
    from spec_decode.engines.embedded.handler import serve
    from spec_decode.engines.embedded.ranks import RankDied, RankGroup
    from spec_decode.engines.embedded.server import EngineState, bind, exit_on_rank_death
    from spec_decode.engines.plugins import load_plugins

    try:
        httpd = bind(args.host, args.port)
    except OSError as e:
        fail(f"--port {args.port}: cannot listen on {args.host}:{args.port} ({e.strerror})")
    # As SGLang's launcher: plugins load in this process too; each rank loads them again after joining
    # its group. The front runs no decoding, so its hooks are registered, not applied: applying imports
    # their targets (decoding, torch: ~1.4 s of CPU per server launch) for hooks that never fire here.
    logging.info("front (pid %d): plugins loaded: %s", os.getpid(), load_plugins(apply=False))
    resolved = {k: v for k, v in vars(args).items()}
    if layer_ids is not None:
        resolved["eagle_aux_hidden_state_layer_ids"] = layer_ids
    logging.info("server_args=%s", json.dumps(resolved, sort_keys=True))
    spec = RankSpec(
        model_path=args.model_path,
        draft_model_path=args.speculative_draft_model_path,
        steps=args.speculative_num_steps or 0,
        tp_size=args.tp_size,
        device=args.device,
        cpu_threads=args.cpu_threads,
        random_seed=args.random_seed,
        decode_log_interval=args.decode_log_interval,
        log_level=args.log_level,
        dist_port=0,
        front_pid=0,
        disable_cuda_graph=args.disable_cuda_graph,
        max_running_requests=args.max_running_requests,
        disable_overlap_schedule=args.disable_overlap_schedule,
        cuda_eager_batching=args.cuda_eager_batching,
        cuda_graph_max_bs=args.cuda_graph_max_bs_decode,
        static_path=args.static_path,
        torch_compile=args.enable_torch_compile,
        proj_split=args.proj_split,
    )
    try:
        group = RankGroup(spec)
    except RankDied as e:
        fail(f"a rank failed during start-up: {e}")
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    context = json.loads((Path(args.model_path) / "config.json").read_text())["max_position_embeddings"]
    state = EngineState(group, resolved, context, spec.steps, speculative=bool(args.speculative_algorithm))
    group.watch(exit_on_rank_death(state))
    try:
        serve(httpd, state)
    except KeyboardInterrupt:
        group.close()


if __name__ == "__main__":
    main()
