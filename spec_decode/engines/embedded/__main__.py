"""python -m spec_decode.engines.embedded [SGLang-style flags]

Our CPU (or CUDA) inference server for the tiny Llama target and its EAGLE-3 drafter. It takes
SGLang 0.5.23's flag names for what it supports and refuses unknown flags (exit 2, flag named).
Without speculative flags it is the baseline engine (plain greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spec_decode.engines.embedded", description=__doc__,
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
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch threads (tiny models decode fastest on 1: per-op overhead dominates)")
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
        parser.error("set all of --speculative-num-steps, --speculative-eagle-topk and "
                     "--speculative-num-draft-tokens, or none (SGLang asserts the same)")
    if not args.speculative_draft_model_path:
        parser.error("--speculative-draft-model-path is required with --speculative-algorithm EAGLE3")
    if args.speculative_num_steps < 1:
        parser.error(f"--speculative-num-steps must be >= 1 (got {args.speculative_num_steps})")
    if args.speculative_eagle_topk != 1:
        parser.error(f"--speculative-eagle-topk {args.speculative_eagle_topk}: the embedded engine "
                     "drafts chains only (topk 1)")
    if args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
        logging.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def check_models(args: argparse.Namespace) -> None:
    """Start-up checks that SGLang would also fail on, with a message that says what to do."""
    from .model import DRAFTER_ARCH

    target = Path(args.model_path)
    if not (target / "config.json").is_file() or not (target / "model.safetensors").is_file():
        fail(f"--model-path {target}: no config.json/model.safetensors there "
             f"(run `dvc pull {target}` or `dvc repro` to build the tiny models)")
    tcfg = json.loads((target / "config.json").read_text())
    if not args.speculative_algorithm:
        return
    draft = Path(args.speculative_draft_model_path)
    if not (draft / "config.json").is_file() or not (draft / "model.safetensors").is_file():
        fail(f"--speculative-draft-model-path {draft}: no config.json/model.safetensors there "
             f"(run `dvc pull {draft}`)")
    try:
        dcfg = json.loads((draft / "config.json").read_text())
    except json.JSONDecodeError as e:
        fail(f"{draft / 'config.json'} is not valid JSON: {e}")
    if dcfg.get("architectures") != [DRAFTER_ARCH]:
        fail(f"{draft / 'config.json'}: architectures is {dcfg.get('architectures')!r}, an EAGLE-3 "
             f"drafter must say [\"{DRAFTER_ARCH}\"]")
    n = tcfg["num_hidden_layers"]
    ids = (dcfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = [1, n // 2 - 1, n - 4]  # SGLang's default capture
        dcfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = ids
    if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i <= n - 2 for i in ids):
        fail(f"{draft / 'config.json'}: eagle_aux_hidden_state_layer_ids {ids} must be 3 layer ids "
             f"in 0..{n - 2} for a {n}-layer target")
    if dcfg.get("hidden_size") != tcfg["hidden_size"]:
        fail(f"drafter hidden_size {dcfg.get('hidden_size')} != target hidden_size {tcfg['hidden_size']}")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_spec(args, parser)
    if args.tp_size != 1:
        parser.error(f"--tp-size {args.tp_size}: the embedded engine runs in one process (tp 1)")
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout,
    )
    check_models(args)

    import torch

    torch.set_num_threads(args.cpu_threads)
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is visible")
    from ...parsers.profile import rank_path
    from .decoding import Decoder
    from .model import load_drafter, load_target
    from .server import EngineState, serve

    target = load_target(args.model_path, args.device)
    drafter = (load_drafter(args.speculative_draft_model_path, target, args.device)
               if args.speculative_algorithm else None)
    profile = os.environ.get("SPEC_DECODE_PROFILE") or None
    decoder = Decoder(target, drafter, args.speculative_num_steps or 0, profile=bool(profile))
    resolved = {k: v for k, v in vars(args).items()}
    if drafter is not None:
        resolved["eagle_aux_hidden_state_layer_ids"] = list(drafter.shape.aux_layer_ids)
    logging.info("server_args=%s", json.dumps(resolved, sort_keys=True))
    # Warm the kernels once so the first request does not pay for lazy initialisation.
    decoder.generate([32] * 8, 8)
    # One process, rank 0: its profile file is the one the runner reads (parsers.profile.rank_path).
    state = EngineState(decoder, resolved, args.decode_log_interval,
                        rank_path(profile, 0) if profile else None)
    try:
        serve(state, args.host, args.port)
    except OSError as e:
        fail(f"--port {args.port}: cannot listen on {args.host}:{args.port} ({e.strerror})")
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
