"""Generate a synthetic target and its EAGLE-3 drafter: a real shape, seeded random weights (issue 31).

    python -m spec_decode build synthetic --model llama31_8b_shape --drafter llama31_8b_shape_eagle3 --device cuda

reads conf/model/<model>.yaml and conf/drafter/<drafter>.yaml (their ``synthetic`` section: shape, seed,
dtype; core/synthetic.py) and writes config.json, model.safetensors, the byte tokenizer's files and
``synthetic.json`` (the spec it was made from) into each conf's ``path``. A directory whose
synthetic.json already matches is kept (generation is skipped). Nothing here is committed: the conf
is the versioned input, the weights are made where they run.

Each tensor has its own generator, seeded from (seed, tensor name): N(0, 0.02) for matrices and
embeddings (HF's initializer_range), ones for norms, identity d2t/t2d maps. The values depend on the
seed and on the generating device's RNG (CPU and CUDA draw differently; synthetic.json says which):
a decode step's cost does not depend on them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from spec_decode.core.drafter import default_layer_ids
from spec_decode.core.synthetic import RECORD, SyntheticConfig, from_mapping, generated_matches
from spec_decode.engines.embedded.eagle3 import Eagle3Drafter
from spec_decode.engines.embedded.layers import embedding
from spec_decode.engines.embedded.model import LlamaTarget
from spec_decode.engines.embedded.shapes import (
    DrafterShape,
    LlamaShape,
    drafter_config_json,
    target_config_json,
)
from spec_decode.engines.embedded.tokenizer import write_tokenizer_files

CONF = Path(__file__).resolve().parents[3] / "conf"
INIT_STD = 0.02


def target_shape(syn: SyntheticConfig) -> LlamaShape:
    return LlamaShape(**{k: getattr(syn, k) for k in LlamaShape.__dataclass_fields__})


def drafter_shape(syn: SyntheticConfig, target: SyntheticConfig, layer_ids: list[int] | None) -> DrafterShape:
    if syn.hidden_size != target.hidden_size or syn.vocab_size != target.vocab_size:
        raise SystemExit(
            f"drafter synthetic.hidden_size/vocab_size ({syn.hidden_size}/{syn.vocab_size}) must "
            f"equal the target's ({target.hidden_size}/{target.vocab_size}): EAGLE-3 shares the "
            "target's embedding"
        )
    ids = list(layer_ids) if layer_ids else default_layer_ids(target.num_hidden_layers)
    return DrafterShape(
        **{k: getattr(syn, k) for k in LlamaShape.__dataclass_fields__},
        target_hidden_size=target.hidden_size,
        draft_vocab_size=syn.draft_vocab_size or syn.vocab_size,
        aux_layer_ids=ids,
    )


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def random_state(module: torch.nn.Module, seed: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The module's state dict (built on the meta device: names and shapes only), filled per tensor."""
    state = {}
    for name, t in module.state_dict().items():
        if name.endswith("norm.weight"):
            value = torch.ones(t.shape, dtype=dtype)
        elif name == "d2t":  # draft id -> target id offset: the draft vocabulary is the first ids
            value = torch.zeros(t.shape, dtype=torch.int64)
        elif name == "t2d":
            value = torch.ones(t.shape, dtype=torch.bool)
        else:
            g = _generator(seed, name, device)
            value = (torch.randn(t.shape, generator=g, device=device) * INIT_STD).to(dtype).cpu()
        state[name] = value.contiguous()
    return state


def write(out: Path, config: dict, state: dict, record: dict) -> None:

    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).unlink(missing_ok=True)  # written last: a half-written directory never matches
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(state, str(out / "model.safetensors"))
    (out / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def generate_target(syn: SyntheticConfig, out: Path, device: str = "cpu") -> dict:
    shape = target_shape(syn)
    with torch.device("meta"):
        model = LlamaTarget(shape)
    t0 = time.monotonic()
    state = random_state(model, syn.seed, getattr(torch, syn.dtype), torch.device(device))
    config = {**target_config_json(shape), "torch_dtype": syn.dtype}
    record = _record("target", syn, state, device, t0)
    write(out, config, state, record)
    write_tokenizer_files(out, shape.max_position_embeddings)
    return record


def generate_drafter(
    syn: SyntheticConfig, target: SyntheticConfig, layer_ids: list[int] | None, out: Path, device: str = "cpu"
) -> dict:
    shape = drafter_shape(syn, target, layer_ids)
    with torch.device("meta"):
        embed = embedding(target.vocab_size, target.hidden_size)
        model = Eagle3Drafter(shape, embed)
    t0 = time.monotonic()
    state = random_state(model, syn.seed, getattr(torch, syn.dtype), torch.device(device))
    config = {**drafter_config_json(shape), "torch_dtype": syn.dtype}
    record = {
        **_record("eagle3-drafter", syn, state, device, t0),
        "target_spec_digest": target.digest(),
        "trained_aux_layer_ids": shape.aux_layer_ids,
    }
    write(out, config, state, record)
    return record


def _record(kind: str, syn: SyntheticConfig, state: dict, device: str, t0: float) -> dict:
    return {
        "kind": kind,
        "spec": syn.spec(),
        "spec_digest": syn.digest(),
        "source": syn.source,
        "params": sum(v.numel() for v in state.values()),
        "weight_bytes": sum(v.numel() * v.element_size() for v in state.values()),
        "generated_on": torch.device(device).type,
        "torch": torch.__version__,
        "generate_s": round(time.monotonic() - t0, 2),
        "init": f"N(0, {INIT_STD}) per tensor, seeded by (seed, name)",
    }


def read_conf(group: str, name: str, conf: Path = CONF) -> dict:
    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in (conf / group).glob("*.yaml") if "synthetic" in p.read_text())
        raise SystemExit(
            f"--{group} {name}: no {path} (synthetic ones there: {', '.join(have) or 'none'}; an installed copy of "
            "spec_decode reads the conf/ beside it: run from the repository, with it first on PYTHONPATH)"
        )
    data = yaml.safe_load(path.read_text())
    if not data.get("synthetic"):
        raise SystemExit(f"conf/{group}/{name}.yaml has no synthetic section: its weights are real, not generated")
    return data


def ensure(
    model: str, drafter: str | None, device: str = "cpu", root: Path = Path("."), force: bool = False, conf: Path = CONF
) -> list[str]:
    """Generate what is missing or stale; returns one line per model (generated or kept)."""
    mconf = read_conf("model", model, conf)
    msyn = from_mapping(mconf["synthetic"])
    lines = []
    jobs = [("model", model, mconf, msyn)]
    if drafter:
        dconf = read_conf("drafter", drafter, conf)
        jobs.append(("drafter", drafter, dconf, from_mapping(dconf["synthetic"])))
    for group, name, data, syn in jobs:
        out = root / data["path"]
        why = generated_matches(out, syn)
        if why is None and not force:
            lines.append(f"{group}={name}: {out} matches its spec (seed {syn.seed}, {syn.dtype}); kept")
            continue
        if group == "model":
            rec = generate_target(syn, out, device)
        else:
            rec = generate_drafter(syn, msyn, data.get("layer_ids"), out, device)
        lines.append(
            f"{group}={name}: {rec['params'] / 1e6:.1f}M params, {rec['weight_bytes'] / 2**30:.2f} GiB "
            f"{syn.dtype}, generated on {rec['generated_on']} in {rec['generate_s']} s -> {out}"
        )
    return lines


def add_parser(sub) -> None:
    p = sub.add_parser("synthetic", help="seeded random weights of a real shape (conf's synthetic section)")
    p.add_argument("--model", required=True, help="conf/model/<name>.yaml with a synthetic section")
    p.add_argument("--drafter", default=None, help="conf/drafter/<name>.yaml with a synthetic section")
    p.add_argument("--device", default="cpu", help="where the random numbers are drawn (cuda: fast for 8B)")
    p.add_argument("--force", action="store_true", help="regenerate even when synthetic.json matches")


def main(args: argparse.Namespace) -> None:
    for line in ensure(args.model, args.drafter, args.device, force=args.force):
        print(line, flush=True)


if __name__ == "__main__":  # the library behind a subcommand
    from spec_decode.core.errors import run_as

    run_as(__spec__.name, "spec-decode build synthetic", "spec_decode.engines.embedded.build synthetic")
