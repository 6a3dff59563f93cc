"""Deterministic builds of the tiny target and its EAGLE-3 drafter (DVC stages `target`, `drafter`).

    python -m spec_decode.engines.embedded.build target  --corpus data/corpus.txt --out models/tiny/target
    python -m spec_decode.engines.embedded.build drafter --corpus data/corpus.txt \
        --target models/tiny/target --out models/tiny/drafter --layer-ids 1,3,4

Fixed seeds, ``torch.use_deterministic_algorithms(True)``, a fixed data order and a fixed thread count
make a rebuild bit-identical on the same torch build and CPU. The thread count is part of the recipe:
reductions in the backward pass differ between 1 and 2 threads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import (
    DrafterShape,
    Eagle3Drafter,
    LlamaShape,
    LlamaTarget,
    drafter_config_json,
    read_config,
    target_config_json,
)
from .tokenizer import encode, write_tokenizer_files


def _setup(seed: int, threads: int) -> torch.Generator:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _batches(data: torch.Tensor, gen: torch.Generator, batch: int, length: int):
    while True:
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=gen)
        yield torch.stack([data[s : s + length] for s in starts.tolist()])


def _lr(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _save(model_dir: Path, config: dict, state: dict[str, torch.Tensor], record: dict) -> str:
    from safetensors.torch import save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = model_dir / "model.safetensors"
    save_file({k: v.detach().contiguous() for k, v in sorted(state.items())}, str(weights))
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    record = {**record, "weights_sha256": digest}
    (model_dir / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return digest


def _corpus_tensor(path: str) -> torch.Tensor:
    return torch.tensor(encode(Path(path).read_text(encoding="ascii")), dtype=torch.long)


def build_target(args: argparse.Namespace) -> None:
    gen = _setup(args.seed, args.threads)
    shape = LlamaShape(
        hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, intermediate_size=args.ffn, max_position_embeddings=args.max_len,
    )
    model = LlamaTarget(shape)
    data = _corpus_tensor(args.corpus)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    t0, loss_val = time.monotonic(), float("nan")
    for step, batch in zip(range(args.steps), _batches(data, gen, args.batch, args.seq + 1)):
        for group in opt.param_groups:
            group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
        logits, _ = model.forward_train(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, shape.vocab_size), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"target step {step:4d} loss {loss_val:.4f} ({time.monotonic() - t0:.0f}s)", flush=True)
    out = Path(args.out)
    params = sum(p.numel() for p in model.parameters())
    record = {
        "kind": "target", "params": params, "steps": args.steps, "final_loss": round(loss_val, 4),
        "seed": args.seed, "threads": args.threads, "seq": args.seq, "batch": args.batch,
        "corpus": args.corpus, "torch": torch.__version__,
    }
    digest = _save(out, target_config_json(shape), model.state_dict(), record)
    write_tokenizer_files(out, shape.max_position_embeddings)
    print(f"target: {params} params, loss {loss_val:.4f}, sha256 {digest[:16]} -> {out}")


def build_drafter(args: argparse.Namespace) -> None:
    from .model import load_target

    gen = _setup(args.seed, args.threads)
    target = load_target(args.target)
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = read_config(args.target)
    ids = [int(x) for x in args.layer_ids.split(",")]
    n_layers = tcfg["num_hidden_layers"]
    if len(ids) != 3 or not all(0 <= i <= n_layers - 2 for i in ids):
        raise SystemExit(f"--layer-ids must be 3 ids in 0..{n_layers - 2} (got {ids})")
    shape = DrafterShape(
        **{k: tcfg[k] for k in LlamaShape.__dataclass_fields__ if k != "num_hidden_layers"},
        num_hidden_layers=1, target_hidden_size=tcfg["hidden_size"],
        draft_vocab_size=tcfg["vocab_size"], aux_layer_ids=ids,
    )
    drafter = Eagle3Drafter(shape, target.model.embed_tokens)
    data = _corpus_tensor(args.corpus)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    t0 = time.monotonic()
    agree: list[float] = []
    for step, batch in zip(range(args.steps), _batches(data, gen, args.batch, args.seq)):
        for group in opt.param_groups:
            group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
        with torch.no_grad():
            t_logits, feats = target.forward_train(batch, capture=ids)
            t_probs = torch.softmax(t_logits, -1)
        step_logits = drafter.ttt_logits(batch, feats, args.ttt_steps)
        t, loss, agree = batch.shape[1], 0.0, []
        for j, logits in enumerate(step_logits, start=1):
            valid = t - j  # chains t' whose target position t'+j <= t-1
            lp = torch.log_softmax(logits[:, :valid], -1)
            ref = t_probs[:, j : j + valid]
            loss = loss + (0.8 ** (j - 1)) * -(ref * lp).sum(-1).mean()
            agree.append((lp.argmax(-1) == ref.argmax(-1)).float().mean().item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            acc = " / ".join(f"{a:.3f}" for a in agree)
            print(f"drafter step {step:4d} loss {loss.item():.4f} top1 {acc} ({time.monotonic() - t0:.0f}s)",
                  flush=True)
    n_params = sum(p.numel() for p in params)
    record = {
        "kind": "eagle3-drafter", "params": n_params, "steps": args.steps, "seed": args.seed,
        "threads": args.threads, "seq": args.seq, "batch": args.batch, "ttt_steps": args.ttt_steps,
        # What the drafter was trained on. Preflight compares this with the ids it is served with.
        "trained_aux_layer_ids": ids,
        "target_weights_sha256": json.loads((Path(args.target) / "training.json").read_text())[
            "weights_sha256"],
        "final_top1_agreement": [round(a, 4) for a in agree], "torch": torch.__version__,
    }
    digest = _save(Path(args.out), drafter_config_json(shape), drafter.state_dict(), record)
    print(f"drafter: {n_params} params, top1 {agree}, sha256 {digest[:16]} -> {args.out}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("target", "drafter"):
        p = sub.add_parser(name)
        p.add_argument("--corpus", default="data/corpus.txt")
        p.add_argument("--out", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--steps", type=int, default=300)
        p.add_argument("--batch", type=int, default=6)
        p.add_argument("--seq", type=int, default=640)
        p.add_argument("--lr", type=float, default=3e-3)
        p.add_argument("--warmup", type=int, default=20)
    t = sub.choices["target"]
    t.add_argument("--hidden", type=int, default=192)
    t.add_argument("--layers", type=int, default=6)
    t.add_argument("--heads", type=int, default=6)
    t.add_argument("--ffn", type=int, default=512)
    t.add_argument("--max-len", type=int, default=1024)
    d = sub.choices["drafter"]
    d.add_argument("--target", required=True)
    d.add_argument("--layer-ids", default="1,3,4")
    d.add_argument("--ttt-steps", type=int, default=3)
    args = ap.parse_args(argv)
    (build_target if args.what == "target" else build_drafter)(args)


if __name__ == "__main__":
    main()
