"""TGI's response and error shapes: tokens, top tokens, prefill details."""

from __future__ import annotations

from starlette.responses import JSONResponse

from serving.common import ERROR_STATUS, error_response
from serving.generation import TokenTexts, token_logprob
from serving.generation import top_logprobs as top_entries
from serving.tgi.requests import TgiRequest
from serving.validation import RequestError

STATUS = {**ERROR_STATUS, "validation": 422}  # TGI's statuses: a validation error is a 422


ERROR_TYPE = {
    "invalid_json": "validation",
    "too_large": "validation",
    "unsupported_media_type": "validation",
}


def tgi_error(error: RequestError) -> JSONResponse:
    """TGI's error body: ``{"error": message, "error_type": kind}``."""
    body = {"error": error.message, "error_type": ERROR_TYPE.get(error.kind, error.kind)}
    return error_response(error, body, STATUS)


def finish_reason(completion) -> str:
    if completion.finish_reason == "length":
        return "length"
    return "eos_token" if completion.stop_reason is None else "stop_sequence"


def token_json(texts: TokenTexts, token_id: int, text: str, logprob: float | None) -> dict:
    return {"id": token_id, "text": text, "logprob": logprob, "special": texts.is_special(token_id)}


def top_tokens_json(texts: TokenTexts, entry: dict | None, count: int) -> list[dict]:
    return [token_json(texts, t, texts.text(t), lp) for t, lp in top_entries(entry, count)]


def prefill_json(texts: TokenTexts, parsed: TgiRequest, prompt_logprobs) -> list[dict]:
    """Prompt tokens with their logprobs given the prefix (the first token's is null)."""
    entries = prompt_logprobs or [None] * len(parsed.prompt_token_ids)
    return [
        {"id": t, "text": texts.text(t), "logprob": token_logprob(entry, t)}
        for t, entry in zip(parsed.prompt_token_ids, entries, strict=True)
    ]
