"""``POST /generate`` bodies: SGLang 0.5.23's schema (``sglang/api/v1/api_types.py``), checked field by
field, so that every bad body is a :class:`RequestError` (HTTP 400) naming the field -- never a 500.

Types follow SGLang's msgspec schema (``Optional`` = null allowed; a float field takes an int; a bool
is not an int). Unknown ``sampling_params`` keys are refused like SGLang; unknown top-level keys are
ignored like SGLang. On top of the schema, values the embedded engine cannot honour are refused
rather than silently ignored: it decodes greedily (``temperature`` 0), with no stop strings,
penalties, logit bias, constrained decoding or logprobs. ``stream: true`` is served (server.py: SSE as
SGLang 0.5.23), with ``sampling_params.stream_interval``.

A batch is SGLang's (``GenerateReqInput.normalize_batch_and_arguments``): ``text`` a list of strings or
``input_ids`` a list of lists (a list of one too), ``sampling_params`` one object for all or a list of
one per prompt, ``rid`` a list of one per prompt; the answer is a list (:func:`parse_batch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spec_decode.engines.embedded.server_args import max_new_tokens
from spec_decode.engines.embedded.tokenizer import encode

VOCAB = 256  # byte-level: token id == byte value


class RequestError(ValueError):
    """A bad request: answered with HTTP 400 and this message; the server keeps serving."""


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: list[int]
    max_new_tokens: int
    stream: bool = False
    # SGLang's sampling_params.stream_interval (server default 1): a chunk when at least this many
    # tokens are unsent; the first token and the finish are always sent.
    stream_interval: int = 1
    # SGLang's GenerateReqInput.rid: the request's id inside the engine (Req.rid, the profiler's
    # ``rids``) and in meta_info.id; a fresh uuid4 hex when the body gives none.
    rid: str | None = None


def kind_of(v: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str_or_list(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


# sampling_params key -> (type check, what it must be). The schema of SGLang 0.5.23, in its order.
_INT, _NUM, _STR, _BOOL = (
    (is_int, "an integer"),
    (is_number, "a number"),
    (lambda v: isinstance(v, str), "a string"),
    (lambda v: isinstance(v, bool), "a boolean"),
)
SAMPLING_SCHEMA: dict[str, tuple] = {
    "max_new_tokens": _INT,
    "stop": (_is_str_or_list, "a string or a list of strings"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(is_int(x) for x in v), "a list of integers"),
    "stop_regex": (_is_str_or_list, "a string or a list of strings"),
    "temperature": _NUM,
    "top_p": _NUM,
    "top_k": _INT,
    "min_p": _NUM,
    "frequency_penalty": _NUM,
    "presence_penalty": _NUM,
    "repetition_penalty": _NUM,
    "min_new_tokens": _INT,
    "n": _INT,
    "json_schema": _STR,
    "regex": _STR,
    "ebnf": _STR,
    "structural_tag": _STR,
    "ignore_eos": _BOOL,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "no_stop_trim": _BOOL,
    "stream_interval": _INT,
    "logit_bias": (lambda v: isinstance(v, dict) and all(is_number(x) for x in v.values()), "an object of numbers"),
    "sampling_seed": _INT,
    "custom_params": (lambda v: True, "any JSON value"),
    "beam_width": _INT,
    "watermark": (lambda v: isinstance(v, dict), "an object"),
    "choice": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}
SAMPLING_KEYS = tuple(SAMPLING_SCHEMA)
NOT_NULL = ("logit_bias", "choice")  # plain (non-Optional) fields in SGLang's schema

# Valid in SGLang but not honoured here: refused unless they hold their no-op value.
_NOOP = {
    "stop": lambda v: v in (None, "", []),
    "stop_token_ids": lambda v: not v,
    "stop_regex": lambda v: v in (None, "", []),
    "n": lambda v: v in (None, 1),
    "json_schema": lambda v: v is None,
    "regex": lambda v: v is None,
    "ebnf": lambda v: v is None,
    "structural_tag": lambda v: v is None,
    "logit_bias": lambda v: not v,
    "choice": lambda v: not v,
    "beam_width": lambda v: v in (None, 1),
    "watermark": lambda v: not v or not v.get("enabled"),
    "frequency_penalty": lambda v: v in (None, 0),
    "presence_penalty": lambda v: v in (None, 0),
    "repetition_penalty": lambda v: v in (None, 1),
}
# SGLang's SamplingParams.verify ranges (for the knobs greedy decoding ignores but still checks).
_RANGES = {
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: v == -1 or v >= 1, "-1 or >= 1"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "min_new_tokens": (lambda v: v >= 0, ">= 0"),
    "stream_interval": (lambda v: v >= 1, ">= 1"),
}


def _check_sampling(sp: dict) -> None:
    for key, value in sp.items():
        if key not in SAMPLING_SCHEMA:
            raise RequestError(
                f"unknown field `{key}` in sampling_params, expected one of "
                + ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            )
        check, want = SAMPLING_SCHEMA[key]
        if value is None and key not in NOT_NULL:
            continue
        if not check(value):
            raise RequestError(f"sampling_params.{key} must be {want} (got {kind_of(value)})")
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"sampling_params.{key} must be finite (got {value})")
        if key in _RANGES and not _RANGES[key][0](value):
            raise RequestError(f"sampling_params.{key} must be {_RANGES[key][1]} (got {value!r})")
        if key in _NOOP and not _NOOP[key](value):
            raise RequestError(
                f"sampling_params.{key}={value!r} is not supported by the embedded engine "
                "(greedy decoding of one sequence; leave it at its default)"
            )


def _prompt(body: dict) -> tuple[str, list[int]]:
    """(the field that holds the prompt, its token ids)."""
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text and has_ids:
        raise RequestError("give either `text` or `input_ids`, not both")
    if has_ids:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise RequestError(f"input_ids must be a non-empty list of token ids (got {kind_of(ids)})")
        for i, tok in enumerate(ids):
            if not is_int(tok) or not 0 <= tok < VOCAB:
                raise RequestError(f"input_ids[{i}] must be a token id in 0..{VOCAB - 1} (got {tok!r:.40})")
        return "input_ids", ids
    if has_text:
        text = body["text"]
        if not isinstance(text, str) or not text:
            raise RequestError(f"text must be a non-empty string (got {kind_of(text)})")
        return "text", encode(text)
    raise RequestError("give `text` (a non-empty string) or `input_ids`")


# Top-level fields whose non-default values would change what the server must return.
_UNSUPPORTED = {"return_logprob": "logprobs", "return_hidden_states": "hidden states"}


def parse_generate(body: object, context: int, steps: int) -> GenerateRequest:
    """A /generate body -> what to decode; RequestError naming the field otherwise."""
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object (got {kind_of(body)})")
    sp = body.get("sampling_params")
    if sp is None:
        sp = {}
    if isinstance(sp, list):
        raise RequestError("sampling_params: a list (one per prompt) needs a batch of prompts (`text` a list)")
    if not isinstance(sp, dict):
        raise RequestError(f"sampling_params must be an object (got {kind_of(sp)})")
    _check_sampling(sp)
    for key, what in _UNSUPPORTED.items():
        value = body.get(key)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"{key} must be a boolean (got {kind_of(value)})")
        if value:
            raise RequestError(f"{key}: {what} is not supported by the embedded engine")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream must be a boolean (got {kind_of(stream)})")
    rid = body.get("rid")
    if rid is not None and not _is_str_or_list(rid):
        raise RequestError(f"rid must be a string (got {kind_of(rid)})")
    temperature = sp.get("temperature")
    if temperature is None or temperature != 0:
        raise RequestError(
            "sampling_params.temperature: the embedded engine decodes greedily; send "
            f"temperature 0 (got {temperature!r}; SGLang's default is 1.0)"
        )
    field, ids = _prompt(body)
    room = max_new_tokens(context, steps, len(ids))
    if room < 1:
        raise RequestError(
            f"{field}: the prompt ({len(ids)} tokens) leaves no room for new tokens in the context of {context} tokens"
        )
    n = sp.get("max_new_tokens", 128)
    if n is None:
        n = room  # SGLang: no limit but the context
    if n < 1:
        raise RequestError(f"sampling_params.max_new_tokens must be >= 1 (got {n})")
    if n > room:
        raise RequestError(
            f"{field} ({len(ids)} tokens) + sampling_params.max_new_tokens ({n}) exceeds the "
            f"context of {context} tokens (at most {room} new tokens fit)"
        )
    return GenerateRequest(ids, n, bool(stream), sp.get("stream_interval") or 1, rid if isinstance(rid, str) else None)


@dataclass(frozen=True)
class GenerateBatch:
    """What one /generate body asks for: its requests, and whether it was a batch (a list: SGLang
    answers a list, and each streamed event carries the prompt's ``index``)."""

    reqs: list[GenerateRequest]
    batched: bool = False

    @property
    def stream(self) -> bool:
        return self.reqs[0].stream


def _batch_prompts(body: dict) -> tuple[str, list] | None:
    """(field, its prompts) when the body is a batch, else None (one prompt, or none: parse_generate's)."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None and ids is not None:
        return None  # parse_generate names the conflict
    if isinstance(text, list):
        return "text", text
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        return "input_ids", ids
    return None


def parse_batch(body: object, context: int, steps: int) -> GenerateBatch:
    """A /generate body, one prompt or a batch -> its requests; RequestError naming the field otherwise
    (``text[1] ...`` for a batch's second prompt)."""
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object (got {kind_of(body)})")
    batch = _batch_prompts(body)
    if batch is None:
        return GenerateBatch([parse_generate(body, context, steps)])
    field, prompts = batch
    n = len(prompts)
    if n == 0:
        raise RequestError(f"{field}: an empty batch (give at least one prompt)")
    sps, rids = body.get("sampling_params"), body.get("rid")
    if isinstance(sps, list) and len(sps) != n:
        raise RequestError(f"sampling_params: a list of {len(sps)} for a batch of {n} prompts (give one per prompt)")
    if rids is not None:
        if not isinstance(rids, list) or len(rids) != n:
            raise RequestError(f"rid: a batch of {n} prompts needs a list of {n} rids (got {kind_of(rids)})")
        if len(set(map(str, rids))) != n:
            raise RequestError("rid: the batch's rids must differ")
    reqs = []
    for i, prompt in enumerate(prompts):
        one = {
            **body,
            field: prompt,
            "sampling_params": sps[i] if isinstance(sps, list) else sps,
            "rid": rids[i] if rids is not None else None,
        }
        try:
            reqs.append(parse_generate(one, context, steps))
        except RequestError as e:
            raise RequestError(f"{field}[{i}]: {e}") from None
    return GenerateBatch(reqs, batched=True)
