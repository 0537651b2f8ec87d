"""vLLM's ``/tokenize`` and ``/detokenize`` (errors in OpenAI's shape)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.common import accept
from serving.json_bodies import SlicedJSONResponse
from serving.openai.requests import chat_messages, template_options
from serving.openai.routes import check_model, openai_error
from serving.openai.tool_calls import render_prompt, tool_request
from serving.streaming import run_until_disconnect
from serving.validation import Fields, RequestError, check_token_ids


async def tokenize(request: Request) -> Response:
    """``POST /tokenize``: ``{"prompt"}`` or ``{"messages", ...}`` (both with
    ``add_special_tokens``) -> ``{"count", "max_model_len", "tokens", "token_strs"}``. The
    template, the tokenizer and the answer's JSON run on a parse lane, off the event loop."""
    return await on_parse_lane(request, tokenize_answer)


async def detokenize(request: Request) -> Response:
    """``POST /detokenize``: ``{"tokens"}`` -> ``{"prompt"}``. Checking the ids, decoding them
    and the answer's JSON run on a parse lane, off the event loop."""
    return await on_parse_lane(request, detokenize_answer)


async def on_parse_lane(request: Request, answer) -> Response:
    """``answer(state, body)`` on the parse lane of the request's body (cancelled if the client
    leaves first); a ``RequestError`` in OpenAI's shape."""
    try:
        state, body = await accept(request)
        size = getattr(request.state, "body_bytes", 0)
        return await run_until_disconnect(
            request.receive, state.workers.parse(size, answer, state, body)
        )
    except RequestError as error:
        return openai_error(error)


def tokenize_answer(state, body: dict) -> Response:
    tokens, strings = tokenize_body(state, body)
    return SlicedJSONResponse(
        {
            "count": len(tokens),
            "max_model_len": state.limits.max_total_tokens,
            "tokens": tokens,
            "token_strs": strings,
        }
    )


def tokenize_body(state, body: dict) -> tuple[list[int], list[str] | None]:
    """A ``/tokenize`` body's tokens (and, with ``return_token_strs``, the tokenizer's own token
    strings, as vLLM: ``'Ġis'``, not the decoded ``' is'``). ``messages`` render as a chat
    request's do: ``tools``, ``add_generation_prompt``, ``continue_final_message`` and
    ``chat_template_kwargs`` included."""
    fields = Fields(body)
    check_model(state, fields.string("model"))
    tokenizer = state.llm.tokenizer
    if "messages" in body:
        messages = chat_messages(fields)
        text = render_prompt(
            state, messages, tool_request(state, fields), template_options(fields, messages)
        )
        add_special = fields.boolean("add_special_tokens", False)
    else:
        text = fields.data.get("prompt")
        if not isinstance(text, str):
            raise fields.error("prompt", "must be a string (or send `messages`)")
        add_special = fields.boolean("add_special_tokens", True)
    return_strs = fields.boolean("return_token_strs", False)
    tokens = tokenizer.encode(text, add_special_tokens=add_special)
    strings = list(tokenizer.convert_ids_to_tokens(tokens)) if return_strs else None
    return tokens, strings


def detokenize_answer(state, body: dict) -> Response:
    fields = Fields(body)
    check_model(state, fields.string("model"))
    tokens = body.get("tokens")
    if tokens != []:
        tokens = check_token_ids(tokens, state.limits.vocab_size, "tokens")
    text = state.llm.tokenizer.decode(tokens) if tokens else ""
    return SlicedJSONResponse({"prompt": text})


ROUTES = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
