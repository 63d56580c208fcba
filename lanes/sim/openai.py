"""Bodies in the OpenAI wire format, as vLLM's server sends them."""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def token(i: int) -> str:
    return ("" if i == 0 else " ") + WORDS[i % len(WORDS)]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def prompt_tokens(messages: Any) -> int:
    # A rough count (a word is a token) is enough for usage figures.
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


class Invalid(ValueError):
    """A request vLLM answers 400 (its message says which field and why)."""


@dataclass(frozen=True)
class Params:
    """What the engine needs from one generation request, checked as vLLM checks it."""

    prompt_tokens: int
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    script: str | None = None


def _positive(body: dict, name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid(f"{name}: Input should be a valid integer, got {value!r}")
    if value < 1:
        # vLLM's SamplingParams: "max_tokens must be at least 1, got 0."
        raise Invalid(f"{name} must be at least 1, got {value}.")
    return value


def _common(body: dict, prompt: int, default_max_tokens: int | None, script: str | None = None) -> Params:
    max_tokens = _positive(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _positive(body, "max_tokens", default_max_tokens)
    n = _positive(body, "n", 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise Invalid(f"stream: Input should be a valid boolean, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise Invalid(f"stream_options: Input should be a valid dictionary, got {options!r}")
    return Params(prompt_tokens=prompt, max_tokens=max_tokens, n=n, stream=bool(stream),
                  include_usage=bool(options.get("include_usage")), script=script)


def chat_params(body: dict) -> Params:
    """A chat request's parameters, or :class:`Invalid` as vLLM's 400 would say it."""
    if "messages" not in body:
        raise Invalid("messages: Field required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise Invalid(f"messages: Input should be a valid list, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Invalid(f"messages.{i}: each message must be an object with a string 'role'")
    return _common(body, prompt_tokens(messages), None, scripted_answer(messages))


def completion_params(body: dict) -> Params:
    """A /v1/completions request (default max_tokens 16, as vLLM's CompletionRequest)."""
    if "prompt" not in body:
        raise Invalid("prompt: Field required")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        tokens = len(prompt.split())
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = len(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise Invalid("prompt: the simulator serves one prompt per request (send a batch as separate requests)")
    else:
        raise Invalid("prompt: Input should be a string, a list of token ids, or a list of one of these")
    return _common(body, tokens, 16)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# The memory-extraction prompt carries this marker (lanes.memory.extraction);
# the simulator then answers as an extractor would, so the answer parses.
EXTRACTION_MARKER = "[lanes:memory-extraction]"


def scripted_answer(messages: Any) -> str | None:
    """A memory-extraction answer (one note per user line of the transcript), or None."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return None
    if EXTRACTION_MARKER not in str(messages[0].get("content", "")):
        return None
    transcript = "\n".join(str(m.get("content", "")) for m in messages[1:] if isinstance(m, dict))
    notes = [f"The user said: {line[len('user: '):].strip()}" for line in transcript.splitlines() if line.startswith("user: ")]
    return json.dumps({"notes": notes[:20]})


def piece(script: str, i: int, tokens: int) -> str:
    """The i-th of ``tokens`` slices of ``script``; together they are the whole of it."""
    return script[len(script) * i // tokens:len(script) * (i + 1) // tokens]


def text_token(script: str | None, i: int, tokens: int) -> str:
    """Token i of an answer of ``tokens`` tokens: a slice of the script, or a made-up word."""
    return token(i) if script is None else piece(script, i, tokens)


def answer_text(tokens: int, script: str | None = None) -> str:
    return script if script is not None else "".join(token(i) for i in range(tokens))


def completion(model: str, answers: list[tuple[int, str]], prompt: int, script: str | None = None) -> dict[str, Any]:
    """A chat completion with a choice per ``(tokens, finish_reason)`` of ``answers``."""
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": answer_text(tokens, script)},
             "finish_reason": reason}
            for i, (tokens, reason) in enumerate(answers)
        ],
        "usage": usage(prompt, sum(tokens for tokens, _ in answers)),
    }


def text_completion(model: str, answers: list[tuple[int, str]], prompt: int) -> dict[str, Any]:
    """A /v1/completions answer, as vLLM's CompletionResponse."""
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": answer_text(tokens), "logprobs": None, "finish_reason": reason, "stop_reason": None}
            for i, (tokens, reason) in enumerate(answers)
        ],
        "usage": usage(prompt, sum(tokens for tokens, _ in answers)),
    }


class ChunkWriter:
    """The ``data: {...}`` lines of one streamed chat completion (choice ``index`` per sequence)."""

    def __init__(self, model: str) -> None:
        self.base = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, index: int = 0, **extra: Any) -> bytes:
        body = {**self.base, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}], **extra}
        return b"data: " + dumps(body) + b"\n\n"

    def role(self, index: int) -> bytes:
        return self.chunk({"role": "assistant", "content": ""}, index=index)

    def text(self, text: str, finish_reason: str | None, index: int) -> bytes:
        return self.chunk({"content": text}, finish_reason, index)

    def usage_chunk(self, prompt: int, tokens: int) -> bytes:
        body = {**self.base, "choices": [], "usage": usage(prompt, tokens)}
        return b"data: " + dumps(body) + b"\n\n"

    @staticmethod
    def error_chunk(error_body: dict[str, Any]) -> bytes:
        # vLLM's frame for a failure after the stream began: HTTP stays 200.
        return b"data: " + dumps(error_body) + b"\n\n"

    DONE = b"data: [DONE]\n\n"


class TextChunkWriter(ChunkWriter):
    """A streamed /v1/completions answer: no role chunk, ``text`` in each choice."""

    def __init__(self, model: str) -> None:
        self.base = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model}

    def role(self, index: int) -> bytes:
        return b""

    def text(self, text: str, finish_reason: str | None, index: int) -> bytes:
        body = {**self.base, "choices": [{"index": index, "text": text, "logprobs": None,
                                          "finish_reason": finish_reason, "stop_reason": None}]}
        return b"data: " + dumps(body) + b"\n\n"


def embedding_inputs(value: Any) -> list[str] | None:
    """The texts of an embeddings request, or None when the input is malformed."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) for v in value):  # one pre-tokenised input
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) for v in value):
            return [" ".join(map(str, v)) for v in value]
    return None


def vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``: equal texts embed equally."""
    digest = hashlib.sha256(text.encode()).digest()
    while len(digest) < dim:
        digest += hashlib.sha256(digest).digest()
    raw = [b / 255.0 - 0.5 for b in digest[:dim]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def embeddings(model: str, texts: list[str], dim: int) -> dict[str, Any]:
    count = sum(len(t.split()) for t in texts)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector(t, dim)} for i, t in enumerate(texts)],
        "model": model,
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }


def models_list(models: dict[str, int], owned_by: str = "vllm") -> dict[str, Any]:
    """vLLM's /v1/models: each model card with its ``max_model_len``."""
    now = int(time.time())
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": now, "owned_by": owned_by, "root": name, "parent": None,
                  "max_model_len": limit} for name, limit in sorted(models.items())],
    }
