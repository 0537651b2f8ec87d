"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving.common import accept, encode_text
from serving.generation import Generation, GenerationAborted, GenerationFailed, merge
from serving.openai_format import ChatFormat, CompletionFormat, usage
from serving.prompt_logprobs_format import logit_bias_field, prompt_logprobs_field
from serving.streaming import EventStreamResponse, run_until_disconnect, sse_event
from serving.structured_output_requests import (
    compile_constraint,
    constraint_field,
    openai_structured_outputs,
)
from serving.tool_calls import (
    constrain,
    constraint_param,
    message_tool_fields,
    render_prompt,
    tool_request,
)
from serving.validation import (
    Fields,
    RequestError,
    build_sampling_params,
    check_lengths,
    check_token_ids,
)

STATUS = {
    "validation": 400,
    "invalid_json": 400,
    "too_large": 413,
    "unsupported_media_type": 415,
    "timeout": 408,
    "overloaded": 429,
    "unavailable": 503,
    "not_found": 404,
    "model_not_found": 404,
    "generation": 500,
    "internal": 500,
}
ERROR_CODES = {"model_not_found": "model_not_found"}  # OpenAI's string codes; others: the status
ERROR_TYPES = {
    "overloaded": "overloaded_error",
    "unavailable": "service_unavailable",
    "generation": "server_error",
    "internal": "server_error",
}
PARAM_NAMES = {
    "n": "n",
    "max_tokens": "max_tokens",
    "logprobs": "logprobs",
    "prompt_logprobs": "prompt_logprobs",
    "logit_bias": "logit_bias",
}
MAX_CHOICES = 64
MAX_LOGPROBS = 20
ROLES = ("system", "user", "assistant", "tool", "developer")


def openai_error(error: RequestError) -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = openai_error_body(error)
    return JSONResponse(body, status_code=STATUS.get(error.kind, 400), headers=error.headers)


def openai_error_body(error: RequestError) -> dict:
    status = STATUS.get(error.kind, 400)
    return {
        "error": {
            "message": error.message,
            "type": ERROR_TYPES.get(error.kind, "invalid_request_error"),
            "param": error.param,
            "code": ERROR_CODES.get(error.kind, status),
        }
    }


@dataclasses.dataclass
class OpenAIRequest:
    """A checked completion or chat request: one engine request per prompt."""

    model: str
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    params: list[object]
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool = False
    tools: object = None  # a ``ToolRequest`` whose output is read for calls (chat)
    prompt_logprobs: int | None = None  # vLLM's ``prompt_logprobs`` field (the response's)


def parse_common(
    state,
    fields: Fields,
    prompts: list[list[int]],
    *,
    default_max_tokens,
    logprobs: int | None,
    max_tokens_key: str,
    prompt_logprobs: int | None = None,
) -> tuple[list, int, bool, bool]:
    """Sampling parameters (one per prompt), ``n``, ``stream`` and ``include_usage``."""
    limits = state.limits
    fields.string("model")
    fields.string("user")
    fields.unsupported("suffix", allowed=lambda v: v == "")
    n = fields.integer("n", 1, minimum=1, maximum=MAX_CHOICES)
    fields.unsupported("best_of", allowed=lambda v: v == n)
    if n * len(prompts) > MAX_CHOICES:
        raise RequestError(f"prompts x n must be <= {MAX_CHOICES}", param="n")
    stream = fields.boolean("stream", False)
    options = Fields(fields.data.get("stream_options"), "stream_options")
    include_usage = options.boolean("include_usage", False)
    if fields.data.get("stream_options") is not None and not stream:
        raise RequestError("`stream_options` is only allowed with `stream`", param="stream_options")
    max_tokens = fields.integer(max_tokens_key, minimum=1)
    if max_tokens_key == "max_completion_tokens" and max_tokens is None:
        max_tokens = fields.integer("max_tokens", minimum=1)
    sampling = dict(
        n=n,
        temperature=fields.number("temperature", 1.0, minimum=0.0, maximum=2.0),
        top_p=fields.number("top_p", 1.0, minimum=0.0, maximum=1.0, exclusive_minimum=True),
        top_k=fields.integer("top_k", 0, minimum=-1),
        min_p=fields.number("min_p", 0.0, minimum=0.0, maximum=1.0),
        presence_penalty=fields.number("presence_penalty", 0.0, minimum=-2.0, maximum=2.0),
        frequency_penalty=fields.number("frequency_penalty", 0.0, minimum=-2.0, maximum=2.0),
        repetition_penalty=fields.number(
            "repetition_penalty", 1.0, minimum=0.0, exclusive_minimum=True
        ),
        min_tokens=fields.integer("min_tokens", 0, minimum=0),
        ignore_eos=fields.boolean("ignore_eos", False),
        skip_special_tokens=fields.boolean("skip_special_tokens", True),
        seed=fields.seed(),
        stop=fields.string_list("stop", max_items=limits.max_stop_sequences),
        stop_token_ids=stop_token_ids(fields, limits.vocab_size),
        logprobs=logprobs,
        structured_outputs=openai_structured_outputs(fields),
        prompt_logprobs=prompt_logprobs,
        logit_bias=logit_bias_field(fields, limits.vocab_size),
    )
    params = []
    for prompt in prompts:
        budget = check_lengths(
            len(prompt), max_tokens, limits, input_name="prompt", output_name=max_tokens_key
        )
        if max_tokens is None and default_max_tokens is not None:
            budget = min(default_max_tokens, budget)
        params.append(
            build_sampling_params(
                {"max_tokens": max_tokens_key, **PARAM_NAMES}, max_tokens=budget, **sampling
            )
        )
    return params, n, stream, include_usage


def stop_token_ids(fields: Fields, vocab_size: int) -> list[int]:
    value = fields.data.get("stop_token_ids")
    if value is None or value == []:
        return []
    return check_token_ids(value, vocab_size, "stop_token_ids")


def parse_completion(state, body: dict) -> OpenAIRequest:
    fields = Fields(body)
    prompt = fields.data.get("prompt")
    vocab = state.limits.vocab_size
    if isinstance(prompt, str):
        texts: list = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        texts = [check_token_ids(prompt, vocab, "prompt")]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        texts = [check_token_ids(p, vocab, "prompt") for p in prompt]
    else:
        raise fields.error(
            "prompt",
            "must be a string, a list of strings, a list of token ids or a list of token-id lists",
        )
    if len(texts) > MAX_CHOICES:
        raise RequestError(f"`prompt` may hold at most {MAX_CHOICES} prompts", param="prompt")
    prompts = [encode_text(state, t) if isinstance(t, str) else t for t in texts]
    logprobs = fields.integer("logprobs", minimum=0, maximum=MAX_LOGPROBS)
    echo = fields.boolean("echo", False)
    prompt_logprobs = prompt_logprobs_field(fields)
    # ``echo`` with ``logprobs``: the prompt tokens' logprobs lead the choice's ``logprobs``.
    engine_prompt_logprobs = prompt_logprobs
    if echo and logprobs is not None:
        engine_prompt_logprobs = max(logprobs, prompt_logprobs or 0)
    params, n, stream, include_usage = parse_common(
        state,
        fields,
        prompts,
        default_max_tokens=16,
        logprobs=logprobs,
        max_tokens_key="max_tokens",
        prompt_logprobs=engine_prompt_logprobs,
    )
    prompt_texts = [t if isinstance(t, str) else None for t in texts]
    return OpenAIRequest(
        state.settings.model_name,
        prompts,
        prompt_texts,
        params,
        n,
        stream,
        include_usage,
        logprobs,
        echo,
        prompt_logprobs=prompt_logprobs,
    )


def parse_chat(state, body: dict) -> OpenAIRequest:
    fields = Fields(body)
    messages = chat_messages(fields)
    tools = tool_request(state, fields)
    fields.unsupported("functions", allowed=lambda v: v == [])
    add_generation_prompt = fields.boolean("add_generation_prompt", True)
    want_logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", minimum=0, maximum=MAX_LOGPROBS)
    if top is not None and not want_logprobs:
        raise RequestError("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    tokenizer = state.llm.tokenizer
    text = render_prompt(state, messages, tools, add_generation_prompt)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    prompt_logprobs = prompt_logprobs_field(fields)
    if prompt_logprobs is not None and fields.data.get("stream") is True:  # as vLLM
        raise RequestError(
            "`prompt_logprobs` are not available when `stream=True`", param="prompt_logprobs"
        )
    params, n, stream, include_usage = parse_common(
        state,
        fields,
        [prompt],
        default_max_tokens=None,
        logprobs=(top or 0) if want_logprobs else None,
        max_tokens_key="max_completion_tokens",
        prompt_logprobs=prompt_logprobs,
    )
    params = constrain(params, tools, body)
    return OpenAIRequest(
        state.settings.model_name,
        [prompt],
        [text],
        params,
        n,
        stream,
        include_usage,
        (top or 0) if want_logprobs else None,
        tools=tools if tools.parses_output else None,
        prompt_logprobs=prompt_logprobs,
    )


def chat_messages(fields: Fields) -> list[dict]:
    """``messages`` as ``[{"role", "content": str}]`` (text content parts are joined), with
    assistant ``tool_calls`` and tool ``tool_call_id``/``name`` when given."""
    messages = fields.data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise fields.error("messages", "must be a non-empty list of messages")
    checked = []
    for i, message in enumerate(messages):
        item = Fields(message, f"messages[{i}]")
        role = item.string("role")
        if role not in ROLES:
            raise item.error("role", f"must be one of {', '.join(ROLES)}")
        content = item.data.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                part_fields = Fields(part, f"messages[{i}].content[{j}]")
                if part_fields.data.get("type") != "text":
                    raise part_fields.error(
                        "type", "must be 'text' (other content is not supported)"
                    )
                parts.append(part_fields.string("text", ""))
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise item.error("content", "must be a string or a list of text parts")
        checked.append(
            {
                "role": "system" if role == "developer" else role,
                "content": content,
                **message_tool_fields(item.data, role, f"messages[{i}]"),
            }
        )
    return checked


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await serve(request, parse_completion, CompletionFormat)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await serve(request, parse_chat, ChatFormat)


def check_model(state, model) -> None:
    """A ``model`` the server does not serve is a 404 (``model_not_found``), as OpenAI's API."""
    if isinstance(model, str) and not state.settings.serves_model(model):
        raise RequestError(
            f"The model `{model}` does not exist.", param="model", kind="model_not_found"
        )


async def serve(request: Request, parse, format_class) -> Response:
    try:
        state, body = await accept(request)
        check_model(state, body.get("model"))
        parsed = parse(state, body)
        constraint = parsed.params[0].structured_outputs
        param = constraint_param(parsed.tools) or constraint_field(body)
        await compile_constraint(state, constraint, param)
        ticket = state.admit()
        ticket.label = request_id_of(request)
    except RequestError as error:
        return openai_error(error)
    streaming = False
    try:
        generations = [
            Generation(state, ticket, prompt, params)
            for prompt, params in zip(parsed.prompts, parsed.params, strict=True)
        ]
        formatter = format_class(
            state,
            parsed,
            request_id=f"{format_class.prefix}-{request_id_of(request)}",
            created=int(time.time()),
        )
        formatter.generations = generations  # streamed echo reads the prompt logprobs
        if parsed.stream:
            streaming = True  # the response releases the ticket when it ends
            return EventStreamResponse(stream_chunks(formatter, generations), ticket.release)
        results = await run_until_disconnect(request.receive, run_all(generations))
    except RequestError as error:
        return openai_error(error)
    except GenerationAborted as error:
        return openai_error(RequestError(f"request aborted: {error}", kind="unavailable"))
    except GenerationFailed as error:
        return openai_error(RequestError(f"generation failed: {error}", kind="generation"))
    finally:
        if not streaming:
            ticket.release()
    return JSONResponse(formatter.response(results))


def request_id_of(request: Request) -> str:
    """The client's ``X-Request-Id`` (``RequestIdMiddleware``) or a new id."""
    return getattr(request.state, "request_id", None) or uuid.uuid4().hex


async def run_all(generations: list[Generation]) -> list:
    """Runs the generations together; if one fails, the others are cancelled (and aborted)."""
    tasks = [asyncio.ensure_future(generation.run()) for generation in generations]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_chunks(formatter, generations: list[Generation]):
    """The chunks of a streamed response. A stream the server cuts short (drain, engine
    failure) ends with a chunk giving each unfinished choice ``finish_reason`` "abort" or
    "error", then an error event with the status a non-streaming request would get, and no
    ``[DONE]``: a client that waits for ``[DONE]`` must not take the cut text as whole."""
    try:
        for chunk in formatter.first_chunks():
            yield sse_event(chunk)
        async for index, deltas in merge([g.stream() for g in generations]):
            for chunk in formatter.chunks(index, deltas):
                yield sse_event(chunk)
        if formatter.parsed.include_usage:
            yield sse_event(formatter.usage_chunk([g.result for g in generations]))
    except RequestError as error:
        yield sse_event(openai_error_body(error))
    except (GenerationAborted, GenerationFailed) as error:
        for index, generation in enumerate(generations):
            for chunk in formatter.chunks(index, generation.cut_deltas()):
                yield sse_event(chunk)
        kind = "unavailable" if isinstance(error, GenerationAborted) else "generation"
        yield sse_event(openai_error_body(RequestError(f"generation stopped: {error}", kind=kind)))
        return
    yield sse_event("[DONE]")


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the one served model."""
    state = request.app.state.server
    model = {
        "id": state.settings.model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "jaxgen",
        "root": state.settings.model,
        "max_model_len": state.limits.max_total_tokens if state.limits else None,
    }
    return JSONResponse({"object": "list", "data": [model]})


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]

__all__ = ["ROUTES", "openai_error", "usage"]
