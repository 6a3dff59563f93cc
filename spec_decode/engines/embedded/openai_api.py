"""SGLang 0.5.23's OpenAI-compatible routes on the embedded engine: ``POST /v1/completions`` and
``POST /v1/chat/completions`` (``srt/entrypoints/openai/protocol.py``, ``serving_completions.py``,
``serving_chat.py``), streamed (SSE ``data: {chunk}``, then ``data: [DONE]``) and not.

A body becomes the same :class:`~spec_decode.engines.embedded.request.GenerateRequest` s that
``/generate`` decodes, with the same rules: greedy only (``temperature`` 0, which SGLang's and
OpenAI's default 1.0 is not: a body without it is refused, naming it), no stop strings, penalties,
logprobs, ``n`` > 1, ``echo``, tools or constrained decoding; unknown top-level keys are ignored (as
SGLang's pydantic models do). Bad bodies get 400 naming the field, in SGLang's OpenAI error shape.

- completions: ``prompt`` a string, a list of strings, a list of token ids or a list of lists (one
  choice per prompt, ``index`` in order); ``max_tokens`` (default 16, OpenAI's; null = the context).
- chat: ``messages`` (``content`` a string or text parts); ``max_completion_tokens`` or the deprecated
  ``max_tokens`` (default: the context). The tiny byte-level model has no chat template: the prompt is
  one ``<role>: <content>`` line per message, then ``assistant:``.
- ``usage``: prompt, completion and total tokens (in the last chunk of a stream only with
  ``stream_options.include_usage``, in every chunk with ``continuous_usage_stats``);
  ``return_spec_tokens_details: true`` adds ``sglext.spec_tokens_details`` (the ``spec_*`` counters).
- Streamed text arrives as deltas that never split a UTF-8 character (a byte token that starts one
  waits for the rest); ``finish_reason`` is ``"length"`` (the engine has no end-of-sequence token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from spec_decode.engines.embedded.request import (
    VOCAB,
    GenerateBatch,
    GenerateRequest,
    RequestError,
    is_int,
    is_number,
    kind_of,
)
from spec_decode.engines.embedded.server_args import max_new_tokens as room_for
from spec_decode.engines.embedded.tokenizer import decode, encode

# Valid in SGLang's request models but not honoured here: refused unless they hold their no-op value.
_NOOP = {
    "n": lambda v: v in (None, 1),
    "best_of": lambda v: v in (None, 1),
    "echo": lambda v: v in (None, False),
    "logprobs": lambda v: v in (None, False, 0),
    "top_logprobs": lambda v: v in (None, 0),
    "suffix": lambda v: v in (None, ""),
    "stop": lambda v: v in (None, "", []),
    "stop_token_ids": lambda v: not v,
    "frequency_penalty": lambda v: v in (None, 0),
    "presence_penalty": lambda v: v in (None, 0),
    "repetition_penalty": lambda v: v in (None, 1),
    "logit_bias": lambda v: not v,
    "regex": lambda v: v is None,
    "json_schema": lambda v: v is None,
    "ebnf": lambda v: v is None,
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "lora_path": lambda v: v is None,
}
_RANGES = {
    "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: is_int(v) and (v == -1 or v >= 1), "-1 or an integer >= 1"),
    "min_p": (lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "min_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "seed": (lambda v: is_int(v), "an integer"),  # greedy: nothing to seed
    "ignore_eos": (lambda v: isinstance(v, bool), "a boolean"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "return_spec_tokens_details": (lambda v: isinstance(v, bool), "a boolean"),
    "model": (lambda v: isinstance(v, str), "a string"),
    "rid": (lambda v: isinstance(v, str), "a string"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
}


@dataclass(frozen=True)
class OpenAIRequest:
    batch: GenerateBatch
    chat: bool
    model: str
    include_usage: bool = False  # a last chunk with usage (stream_options.include_usage)
    continuous_usage: bool = False  # usage in every chunk (stream_options.continuous_usage_stats)
    spec_details: bool = False  # sglext.spec_tokens_details (return_spec_tokens_details)


def _check_common(body: object) -> dict:
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object (got {kind_of(body)})")
    for key, (ok, want) in _RANGES.items():
        value = body.get(key)
        if value is not None and not ok(value):
            raise RequestError(f"{key} must be {want} (got {value!r:.60})")
    for key, noop in _NOOP.items():
        if not noop(body.get(key)):
            raise RequestError(
                f"{key}={body[key]!r:.60} is not supported by the embedded engine "
                "(greedy decoding, one choice per prompt; leave it at its default)"
            )
    temperature = body.get("temperature")
    if not is_number(temperature) or temperature != 0:
        raise RequestError(
            "temperature: the embedded engine decodes greedily; send temperature 0 "
            f"(got {temperature!r:.40}; OpenAI's and SGLang's default is 1.0)"
        )
    return body


def _max_tokens(body: dict, keys: tuple[str, ...], default: int | None) -> int | None:
    for key in keys:
        if key in body:
            value = body[key]
            if value is None:
                return None
            if not is_int(value) or value < 1:
                raise RequestError(f"{key} must be an integer >= 1 (got {value!r:.40})")
            return value
    return default


def _request(
    ids: list[int], field: str, n: int | None, body: dict, context: int, steps: int, rid=None
) -> GenerateRequest:
    room = room_for(context, steps, len(ids))
    if room < 1:
        raise RequestError(f"{field}: the prompt ({len(ids)} tokens) leaves no room in the context of {context} tokens")
    if n is None:
        n = room
    if n > room:
        raise RequestError(
            f"{field} ({len(ids)} tokens) + max_tokens ({n}) exceeds the context of {context} tokens "
            f"(at most {room} new tokens fit)"
        )
    return GenerateRequest(ids, n, bool(body.get("stream")), rid=rid)


def _token_ids(value: object, field: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{field} must be a non-empty list of token ids (got {kind_of(value)})")
    for i, tok in enumerate(value):
        if not is_int(tok) or not 0 <= tok < VOCAB:
            raise RequestError(f"{field}[{i}] must be a token id in 0..{VOCAB - 1} (got {tok!r:.40})")
    return value


def _options(body: dict, batch: GenerateBatch, chat: bool, model: str) -> OpenAIRequest:
    so = body.get("stream_options") or {}
    return OpenAIRequest(
        batch,
        chat,
        model=body.get("model") or model,  # answers name the model asked for (SGLang's), else ours
        include_usage=bool(so.get("include_usage")),
        continuous_usage=bool(so.get("continuous_usage_stats")),
        spec_details=bool(body.get("return_spec_tokens_details")),
    )


def parse_completion(body: object, context: int, steps: int, model: str) -> OpenAIRequest:
    body = _check_common(body)
    n = _max_tokens(body, ("max_tokens",), 16)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt must be a non-empty string")
        prompts = [("prompt", encode(prompt))]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if not all(prompt):
            raise RequestError("prompt: every string of the list must be non-empty")
        prompts = [(f"prompt[{i}]", encode(p)) for i, p in enumerate(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [(f"prompt[{i}]", _token_ids(p, f"prompt[{i}]")) for i, p in enumerate(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = [("prompt", _token_ids(prompt, "prompt"))]
    else:
        raise RequestError(
            f"prompt must be a string, a list of strings, a list of token ids or a list of lists (got {kind_of(prompt)})"
        )
    if body.get("rid") is not None and len(prompts) > 1:
        raise RequestError("rid: one rid for several prompts (leave it out for a batch)")
    reqs = [_request(ids, field, n, body, context, steps, body.get("rid")) for field, ids in prompts]
    return _options(body, GenerateBatch(reqs, batched=len(reqs) > 1), chat=False, model=model)


def _content(message: object, i: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise RequestError(f"messages[{i}] must be an object (got {kind_of(message)})")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise RequestError(f"messages[{i}].role must be a non-empty string (got {kind_of(role)})")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"messages[{i}].content[{j}]: only text parts are supported ({{'type': 'text', 'text': ...}})"
                )
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(f"messages[{i}].content must be a string or a list of text parts (got {kind_of(content)})")
    return role, content


def chat_prompt(messages: list[tuple[str, str]]) -> str:
    """No chat template in the tiny model: one ``<role>: <content>`` line per message, then the cue."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


def parse_chat(body: object, context: int, steps: int, model: str) -> OpenAIRequest:
    body = _check_common(body)
    n = _max_tokens(body, ("max_completion_tokens", "max_tokens"), None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"messages must be a non-empty list of messages (got {kind_of(messages)})")
    ids = encode(chat_prompt([_content(m, i) for i, m in enumerate(messages)]))
    return _options(
        body,
        GenerateBatch([_request(ids, "messages", n, body, context, steps, body.get("rid"))]),
        chat=True,
        model=model,
    )


# ---- answers ------------------------------------------------------------------------------------------
def _usage(outs: list[dict]) -> dict:
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _spec_details(outs: list[dict]) -> dict:
    return {"spec_tokens_details": [{k: v for k, v in o["meta_info"].items() if k.startswith("spec_")} for o in outs]}


def _finish(meta: dict) -> str | None:
    return None if meta["finish_reason"] is None else "length"  # no stop strings, no end-of-sequence token


def response(req: OpenAIRequest, outs: list[dict]) -> dict:
    """The non-streamed answer to ``req`` from its /generate answers (one per prompt, in order)."""
    choices = []
    for i, out in enumerate(outs):
        choice = {"index": i, "logprobs": None, "finish_reason": _finish(out["meta_info"]), "matched_stop": None}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": out["text"], "reasoning_content": None}
        else:
            choice["text"] = out["text"]
        choices.append(choice)
    answer = {
        "id": outs[0]["meta_info"]["id"],
        "object": "chat.completion" if req.chat else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": _usage(outs),
        "metadata": None,
    }
    if req.spec_details:
        answer["sglext"] = _spec_details(outs)
    return answer


def whole_chars(ids: list[int]) -> int:
    """How many of these byte tokens end on a UTF-8 character boundary (a character cut at the end
    waits for its next bytes; bytes that can never complete one are let through, as U+FFFD)."""
    n = len(ids)
    for back in range(1, min(4, n) + 1):
        b = ids[n - back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


def chunks(req: OpenAIRequest, events: Iterator[dict]) -> Iterator[dict]:
    """OpenAI stream chunks from /generate's cumulative events (``index`` on a batch's): each chunk
    carries the text since the previous one of its prompt; the finished event carries the rest and
    ``finish_reason``; with ``include_usage`` a last chunk of no choices holds the usage."""
    n = len(req.batch.reqs)
    sent = [0] * n  # byte tokens sent per prompt
    finals: dict[int, dict] = {}
    created = int(time.time())
    kind = "chat.completion.chunk" if req.chat else "text_completion"
    first_id = None
    for event in events:
        i = event.get("index", 0)
        ids, meta = event["output_ids"], event["meta_info"]
        first_id = first_id or meta["id"]
        done = meta["finish_reason"] is not None
        upto = len(ids) if done else whole_chars(ids)
        text = decode(ids[sent[i] : upto])
        if not text and not done and sent[i] > 0:
            continue
        choice: dict = {"index": i, "logprobs": None, "finish_reason": _finish(meta), "matched_stop": None}
        if req.chat:
            choice["delta"] = {"role": "assistant", "content": text} if sent[i] == 0 else {"content": text}
        else:
            choice["text"] = text
        sent[i] = max(sent[i], upto)
        chunk = {"id": meta["id"], "object": kind, "created": created, "model": req.model, "choices": [choice]}
        chunk["usage"] = _usage([event]) if req.continuous_usage else None
        if done:
            finals[i] = event
            if req.spec_details:
                chunk["sglext"] = _spec_details([event])
        yield chunk
    if req.include_usage and len(finals) == n:
        outs = [finals[i] for i in range(n)]
        yield {
            "id": first_id,
            "object": kind,
            "created": created,
            "model": req.model,
            "choices": [],
            "usage": _usage(outs),
        }
