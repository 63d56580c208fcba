"""Bodies in the OpenAI wire format, as vLLM's server sends them."""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
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


def completion(model: str, tokens: int, prompt: int, finish_reason: str, script: str | None = None) -> dict[str, Any]:
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": script if script is not None else "".join(token(i) for i in range(tokens))},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage(prompt, tokens),
    }


class ChunkWriter:
    """The ``data: {...}`` lines of one streamed completion."""

    def __init__(self, model: str) -> None:
        self.base = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        body = {**self.base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
        return b"data: " + dumps(body) + b"\n\n"

    def usage_chunk(self, prompt: int, tokens: int) -> bytes:
        body = {**self.base, "choices": [], "usage": usage(prompt, tokens)}
        return b"data: " + dumps(body) + b"\n\n"

    @staticmethod
    def error_chunk(error_body: dict[str, Any]) -> bytes:
        # vLLM's frame for a failure after the stream began: HTTP stays 200.
        return b"data: " + dumps(error_body) + b"\n\n"

    DONE = b"data: [DONE]\n\n"


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


def models_list(names: list[str], owned_by: str = "lanes-sim") -> dict[str, Any]:
    now = int(time.time())
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": now, "owned_by": owned_by, "root": n} for n in names],
    }
