"""Rules on a target's shape that both preflight (before any server starts) and the embedded engine (at its
own start-up) apply, with the same words. Plain Python: the engine's front imports it without Hydra or torch."""

from __future__ import annotations


def proj_split_problem(split: int, model_config: dict) -> str | None:
    """Why ``split`` partials cannot serve this target (a model's config.json, its language model part):
    o_proj's input (heads x head dim) and down_proj's (the MLP width) must both divide by it; else None."""
    if split <= 1:
        return None
    heads, hidden = model_config.get("num_attention_heads"), model_config.get("hidden_size")
    head_dim = model_config.get("head_dim") or (hidden // heads if heads and hidden else None)
    sizes = {
        "o_proj": heads * head_dim if heads and head_dim else None,
        "down_proj": model_config.get("intermediate_size"),
    }
    bad = [f"{name}'s input ({n} a row)" for name, n in sizes.items() if isinstance(n, int) and n % split]
    if not bad:
        return None
    both = " and ".join(str(n) for n in sizes.values() if n)
    return f"{' and '.join(bad)} cannot be cut into {split} equal partials; use a divisor of {both} (e.g. 2 or 4)"
