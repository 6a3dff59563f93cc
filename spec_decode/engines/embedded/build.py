r"""Deterministic builds of the tiny target and its EAGLE-3 drafter (DVC stages `target`, `drafter`), and
synthetic real-shape pairs (``synthetic``: seeded random weights, engines/embedded/synthetic.py).

    python -m spec_decode.engines.embedded.build target  --corpus data/corpus.txt --out models/tiny/target
    python -m spec_decode.engines.embedded.build drafter --data data/drafter_train \
        --target models/tiny/target --out models/tiny/drafter --layer-ids 1,3,4 [--samples N]
    python -m spec_decode.engines.embedded.build synthetic --model llama31_8b_shape \
        --drafter llama31_8b_shape_eagle3 --device cuda

The drafter learns from the target's own regenerated text (``drafter_data``), with EAGLE-3's
training-time test, and is scored on the data set's held-out split (training.json ``heldout``). Each
training is logged to MLflow (experiment ``drafter-training``; ``spec_decode.core.lineage``); the run id,
the data set's md5 and the trained prefix's hash land in training.json (the drafter's lineage).

Fixed seeds, deterministic algorithms (``kernels.deterministic``), a fixed data order and a fixed thread count
make a rebuild bit-identical on the same torch build and CPU instruction set (``--kernels native``);
``--kernels pinned`` also fixes the kernel paths (``kernels.py``), bit-identical across instruction
sets. The thread count is part of the recipe: reductions in the backward pass differ between 1 and 2
threads.
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
from safetensors.torch import save_file

from spec_decode.analysis.stats import summarize
from spec_decode.core.lineage import EXPERIMENT as MLFLOW_EXPERIMENT
from spec_decode.core.lineage import log_training
from spec_decode.engines.embedded import kernels, synthetic
from spec_decode.engines.embedded.drafter_data import load as load_data
from spec_decode.engines.embedded.drafter_data import load_frozen_target, sha256_rows
from spec_decode.engines.embedded.model import (
    DrafterShape,
    Eagle3Drafter,
    LlamaShape,
    LlamaTarget,
    drafter_config_json,
    read_config,
    target_config_json,
)
from spec_decode.engines.embedded.tokenizer import encode, write_tokenizer_files

EVAL_STEPS = 5  # held-out acceptance is reported for chains of 1..5 drafts (the benchmarks' step range)


def _setup(seed: int, threads: int, kernel_mode: str) -> torch.Generator:
    torch.set_num_threads(threads)
    kernels.deterministic()
    kernels.check(kernel_mode)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _batches(data: torch.Tensor, gen: torch.Generator, batch: int, length: int):
    while True:
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=gen)
        yield torch.stack([data[s : s + length] for s in starts.tolist()])


def _epochs(n: int, gen: torch.Generator, batch: int):
    """Row indices, batch by batch: a fresh seeded permutation per epoch, so a small data set is seen
    evenly (and repeatedly) rather than by sampling with replacement."""
    while True:
        order = torch.randperm(n, generator=gen)
        if n < batch:  # fewer samples than a batch: repeat within it
            order = order.repeat(batch // n + 1)
        for i in range(0, len(order) - batch + 1, batch):
            yield order[i : i + batch]


def _lr(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _save(model_dir: Path, config: dict, state: dict[str, torch.Tensor], record: dict) -> str:
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
    gen = _setup(args.seed, args.threads, args.kernels)
    shape = LlamaShape(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        intermediate_size=args.ffn,
        max_position_embeddings=args.max_len,
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
        "kind": "target",
        "params": params,
        "steps": args.steps,
        "final_loss": round(loss_val, 4),
        "seed": args.seed,
        "threads": args.threads,
        "seq": args.seq,
        "batch": args.batch,
        "corpus": args.corpus,
        "torch": torch.__version__,
        **kernels.record(args.kernels),
    }
    digest = _save(out, target_config_json(shape), model.state_dict(), record)
    write_tokenizer_files(out, shape.max_position_embeddings)
    print(f"target: {params} params, loss {loss_val:.4f}, sha256 {digest[:16]} -> {out}")


def evaluate(
    drafter: Eagle3Drafter,
    target: LlamaTarget,
    rows: torch.Tensor,
    ids: list[int],
    prompt_tokens: int,
    steps: int = EVAL_STEPS,
    batch: int = 4,
) -> dict:
    """Held-out acceptance of a greedy chain, per draft position j = 1..steps, over every response
    position: ``top1`` = P(draft j == target argmax) and ``chain`` = P(drafts 1..j all agree), which is
    what a greedy chain commits (the data are the target's own greedy text, so the tokens step j reads
    are those the chain would have drafted when 1..j-1 were accepted). ``accept_len[k-1]`` = 1 +
    sum(chain[:k]): the expected tokens per cycle at k steps, bonus token included; its 95% t-interval
    is over the held-out samples (each sample's own mean), the unit that varies."""
    agree_sum = torch.zeros(steps)
    chain_sum = torch.zeros(steps)
    per_sample: list[torch.Tensor] = []  # (steps,) chain acceptance of each held-out sample
    count = 0
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            x = rows[i : i + batch]
            t_logits, feats = target.forward_train(x, capture=ids)
            t_next = t_logits.argmax(-1)
            step_logits = drafter.ttt_logits(x, feats, steps)
            c = x.shape[1] - 1
            # chains whose predictions are response tokens and whose last step is inside the sequence
            chains = torch.arange(c)
            kept = chains[(chains + 1 >= prompt_tokens) & (chains + steps < c)]
            ok = torch.ones(x.shape[0], len(kept), dtype=torch.bool)
            rows_chain = torch.zeros(x.shape[0], steps)
            for j, logits in enumerate(step_logits, start=1):
                pred = drafter.to_target_ids(logits.argmax(-1))[:, kept]
                hit = pred == t_next[:, kept + j]  # the target's next token after position t'+j
                ok = ok & hit
                agree_sum[j - 1] += hit.float().sum()
                chain_sum[j - 1] += ok.float().sum()
                rows_chain[:, j - 1] = ok.float().mean(-1)
            per_sample.extend(rows_chain)
            count += ok.numel()
    top1 = (agree_sum / count).tolist()
    chain = (chain_sum / count).tolist()
    sample_len = [1 + torch.cumsum(r, 0) for r in per_sample]
    ci = []
    for k in range(steps):
        sm = summarize([float(v[k]) for v in sample_len])
        ci.append([round(sm.ci95_lo, 4), round(sm.ci95_hi, 4)])
    return {
        "positions": count,
        "samples": len(per_sample),
        "top1": [round(a, 4) for a in top1],
        "chain": [round(a, 4) for a in chain],
        "accept_len": [round(1 + sum(chain[:k]), 4) for k in range(1, steps + 1)],
        "accept_len_ci95": ci,
    }


def build_drafter(args: argparse.Namespace) -> None:
    gen = _setup(args.seed, args.threads, args.kernels)
    target = load_frozen_target(args.target)  # training arithmetic, independent of the serving path
    tcfg = read_config(args.target)
    ids = [int(x) for x in args.layer_ids.split(",")]
    n_layers = tcfg["num_hidden_layers"]
    if len(ids) != 3 or not all(0 <= i <= n_layers - 2 for i in ids):
        raise SystemExit(f"--layer-ids must be 3 ids in 0..{n_layers - 2} (got {ids})")
    splits, data_rec = load_data(args.data)
    if (
        data_rec["target_weights_sha256"]
        != json.loads((Path(args.target) / "training.json").read_text())["weights_sha256"]
    ):
        raise SystemExit(
            f"{args.data} was generated by another target than {args.target}: rebuild it (dvc repro drafter_data)"
        )
    available = splits["train"].shape[0]
    n = args.samples or available
    if not 1 <= n <= available:
        raise SystemExit(f"--samples {n}: {args.data} holds {available} training samples")
    train = splits["train"][:n]  # a prefix: a larger count is a superset of a smaller one
    prompt_tokens = data_rec["prompt_tokens"]
    shape = DrafterShape(
        **{k: tcfg[k] for k in LlamaShape.__dataclass_fields__ if k != "num_hidden_layers"},
        num_hidden_layers=1,
        target_hidden_size=tcfg["hidden_size"],
        draft_vocab_size=tcfg["vocab_size"],
        aux_layer_ids=ids,
    )
    drafter = Eagle3Drafter(shape, target.model.embed_tokens)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    t0 = time.monotonic()
    agree: list[float] = []
    history: list[dict] = []
    for step, rows in zip(range(args.steps), _epochs(n, gen, args.batch)):
        batch = train[rows]
        for group in opt.param_groups:
            group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
        with torch.no_grad():
            t_logits, feats = target.forward_train(batch, capture=ids)
            t_probs = torch.softmax(t_logits, -1)
        step_logits = drafter.ttt_logits(batch, feats, args.ttt_steps)
        t, loss, agree = batch.shape[1], 0.0, []
        for j, logits in enumerate(step_logits, start=1):
            valid = t - j  # chains t' whose target position t'+j <= t-1
            # only response tokens are targets (EAGLE-3 recipes mask the prompt): t'+j+1 >= prompt
            first = max(0, prompt_tokens - j - 1)
            lp = torch.log_softmax(logits[:, first:valid], -1)
            ref = t_probs[:, j + first : j + valid]
            loss = loss + (0.8 ** (j - 1)) * -(ref * lp).sum(-1).mean()
            agree.append((lp.argmax(-1) == ref.argmax(-1)).float().mean().item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append({"step": step, "loss": loss.item(), "top1": agree})
        if step % 25 == 0 or step == args.steps - 1:
            acc = " / ".join(f"{a:.3f}" for a in agree)
            print(
                f"drafter step {step:4d} loss {loss.item():.4f} top1 {acc} ({time.monotonic() - t0:.0f}s)", flush=True
            )
    held = evaluate(drafter, target, splits["heldout"], ids, prompt_tokens)
    print(
        f"drafter held-out ({held['positions']} chains): top1 {held['top1']} chain {held['chain']} "
        f"accept_len {held['accept_len']}",
        flush=True,
    )
    n_params = sum(p.numel() for p in params)
    subset = train.to(torch.uint8)
    record = {
        "kind": "eagle3-drafter",
        "params": n_params,
        "steps": args.steps,
        "seed": args.seed,
        "threads": args.threads,
        "seq": train.shape[1],
        "batch": args.batch,
        "ttt_steps": args.ttt_steps,
        "lr": args.lr,
        # What the drafter was trained on. Preflight compares this with the ids it is served with.
        "trained_aux_layer_ids": ids,
        "target_weights_sha256": data_rec["target_weights_sha256"],
        # Lineage: the data set (its DVC md5 = file_md5), and the exact prefix trained on.
        "data": {
            "path": str(args.data),
            "file_md5": data_rec["file_md5"],
            "file_sha256": data_rec["file_sha256"],
            "samples": n,
            "samples_available": available,
            "train_subset_sha256": sha256_rows(subset),
            "heldout_sha256": data_rec["heldout_sha256"],
            "temperature": data_rec["temperature"],
        },
        "epochs": round(args.steps * args.batch / n, 3),
        "final_top1_agreement": [round(a, 4) for a in agree],
        "heldout": held,
        # the training run: MLflow experiment drafter-training, tag weights_sha256 (no run id here:
        # it would differ on every rebuild)
        "mlflow_experiment": MLFLOW_EXPERIMENT,
        "torch": torch.__version__,  # no wall time here: it varies between rebuilds (MLflow has it)
        **kernels.record(args.kernels),
    }
    digest = _save(Path(args.out), drafter_config_json(shape), drafter.state_dict(), record)
    print(f"drafter: {n_params} params, {n} samples, sha256 {digest[:16]} -> {args.out}")
    # MLflow only after the weights are safe on disk; a store failure is a warning, not a failed stage
    log_training(Path(args.out), history, held, args.mlflow_uri, wall_s=time.monotonic() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    helps = {"target": "the tiny Llama target (DVC stage target)", "drafter": "its EAGLE-3 drafter (DVC stage drafter)"}
    for name in ("target", "drafter"):
        p = sub.add_parser(name, help=helps[name])
        p.add_argument("--out", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--steps", type=int, default=300)
        p.add_argument("--batch", type=int, default=6)
        p.add_argument("--lr", type=float, default=3e-3)
        p.add_argument("--warmup", type=int, default=20)
        kernels.add_argument(p)
    t = sub.choices["target"]
    t.add_argument("--corpus", default="data/corpus.txt")
    t.add_argument("--seq", type=int, default=640)
    t.add_argument("--hidden", type=int, default=192)
    t.add_argument("--layers", type=int, default=6)
    t.add_argument("--heads", type=int, default=6)
    t.add_argument("--ffn", type=int, default=512)
    t.add_argument("--max-len", type=int, default=1024)
    d = sub.choices["drafter"]
    d.add_argument("--target", required=True)
    d.add_argument("--data", default="data/drafter_train", help="a drafter_data directory (DVC stage drafter_data)")
    d.add_argument("--samples", type=int, default=0, help="train on the first N samples (0 = all)")
    d.add_argument("--layer-ids", default="1,3,4")
    d.add_argument("--ttt-steps", type=int, default=3)
    d.add_argument(
        "--mlflow-uri",
        default=None,
        help="where the training run is logged: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db "
        "(the project's default store); 'off' logs nothing",
    )
    synthetic.add_parser(sub)
    args = ap.parse_args(argv)
    {"target": build_target, "drafter": build_drafter, "synthetic": synthetic.main}[args.what](args)


if __name__ == "__main__":
    kernels.pin_process()
    main()
