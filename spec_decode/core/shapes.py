"""Rules on a target's shape that both preflight (before any server starts) and the embedded engine (at its
own start-up) apply, with the same words. Plain Python: the engine's front imports it without Hydra or torch."""

from __future__ import annotations

import math


def proj_split_problem(split: int, model_config: dict) -> str | None:
    """Why ``split`` partials cannot serve this target (its language model's config.json: a nested
    ``text_config`` is the caller's to unwrap, as ``core.drafter.language_model`` does), else None.
    o_proj's input (heads x head dim, the embedded engine's head dim: hidden / heads, as its LlamaShape) and
    down_proj's (the MLP width) must both divide by it: the StaticRunner's own check, before any rank."""
    if split <= 1:
        return None
    heads, hidden, mlp = (model_config.get(k) for k in ("num_attention_heads", "hidden_size", "intermediate_size"))
    if not all(isinstance(n, int) and n > 0 for n in (heads, hidden, mlp)):
        return None  # not this engine's shape: its loader names what is missing
    widths = {"o_proj": heads * (hidden // heads), "down_proj": mlp}
    if not any(n % split for n in widths.values()):
        return None
    g = math.gcd(*widths.values())
    fits = [d for d in range(2, min(g, 64) + 1) if g % d == 0][:4]
    return (
        f"o_proj's input width ({widths['o_proj']}) and down_proj's ({widths['down_proj']}) must both divide by "
        f"it; " + (f"use one of {', '.join(map(str, fits))}" if fits else "no split count > 1 divides both: use 0")
    )
