"""OpenAI completion and chat request bodies, parsed and checked into an ``OpenAIRequest``:
the prompts tokenized (chat messages through the model's template, with tools), one
``SamplingParams`` per prompt."""

from __future__ import annotations

import dataclasses

from jaxgen.chat_template_options import ChatTemplateError, ChatTemplateOptions
from jaxgen.engine.scheduling.policy import check_priority
from serving.common import check_text_length, encode_text
from serving.openai.beam_search_requests import beam_search_params, uses_beam_search
from serving.openai.prompt_logprobs import logit_bias_field, prompt_logprobs_field
from serving.openai.reasoning import reasoning_params, reasoning_request
from serving.openai.tool_calls import constrain, message_tool_fields, render_prompt, tool_request
from serving.sampling_fields import read_plain_fields
from serving.structured_output_requests import openai_structured_outputs
from serving.validation import (
    Fields,
    RequestError,
    build_sampling_params,
    check_lengths,
    check_token_ids,
)

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
    # chat ``echo``: per prompt (conversation), the final assistant message leading the answer;
    # empty: nothing echoed
    echoed_contents: list[str] = dataclasses.field(default_factory=list)
    beams: list | None = None  # ``use_beam_search``: one ``BeamSearchParams`` per prompt
    return_token_ids: bool = False  # vLLM's: prompt and completion token ids in the answer
    tokens_as_ids: bool = False  # vLLM's ``return_tokens_as_token_ids``: logprobs name ids
    continuous_usage: bool = False  # ``stream_options.continuous_usage_stats``: usage per chunk
    # chat with ``--reasoning-parser``: per prompt, its ``jaxgen.reasoning.ReasoningRequest``;
    # empty: no parser. ``include_reasoning`` (vLLM's): the thinking is in the answer.
    reasonings: list = dataclasses.field(default_factory=list)
    include_reasoning: bool = True
    priority: int = 0  # vLLM's ``priority``: lower first under ``--scheduling-policy priority``


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
    if not uses_beam_search(fields):  # with beam search: the beam width (beam_search_params)
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
        **read_plain_fields(fields),  # temperature, top_p, penalties... (``sampling_fields``)
        seed=fields.seed(),
        stop=fields.string_list("stop", max_items=limits.max_stop_sequences),
        stop_token_ids=stop_token_ids(fields, limits.vocab_size),
        logprobs=logprobs,
        structured_outputs=openai_structured_outputs(fields),
        prompt_logprobs=prompt_logprobs,
        logit_bias=logit_bias_field(fields, limits.vocab_size, limits.max_logit_bias),
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


def vllm_output_fields(fields: Fields, include_usage: bool) -> dict:
    """vLLM's output extensions of both routes: ``return_token_ids``,
    ``return_tokens_as_token_ids`` and ``stream_options.continuous_usage_stats`` (usage on
    every chunk, with ``include_usage``)."""
    options = Fields(fields.data.get("stream_options"), "stream_options")
    return {
        "return_token_ids": fields.boolean("return_token_ids", False),
        "tokens_as_ids": fields.boolean("return_tokens_as_token_ids", False),
        "continuous_usage": include_usage and options.boolean("continuous_usage_stats", False),
    }


def priority_field(state, fields: Fields) -> int:
    """vLLM's ``priority`` (an integer, default 0; lower runs first): 400 naming it for
    anything else, or for a non-zero one when the server schedules first come, first served."""
    priority = fields.integer("priority", 0)
    try:
        return check_priority(priority, state.limits.scheduling_policy)
    except ValueError as error:
        raise RequestError(
            str(error).replace("priority", "`priority`", 1), param="priority"
        ) from None


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
        beams=beam_search_params(fields, params, n),
        priority=priority_field(state, fields),
        **vllm_output_fields(fields, include_usage),
    )


def parse_chat(state, body: dict) -> OpenAIRequest:
    fields = Fields(body)
    messages = chat_messages(fields)
    tools = tool_request(state, fields)
    fields.unsupported("functions", allowed=lambda v: v == [])
    options = template_options(fields, messages)
    echo = fields.boolean("echo", False)
    want_logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", minimum=0, maximum=MAX_LOGPROBS)
    if top is not None and not want_logprobs:
        raise RequestError("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    tokenizer = state.llm.tokenizer
    # The messages' text alone may be too long for any tokenization: refused before the
    # template renders it (and the rendered prompt before it is tokenized).
    check_text_length(state, sum(len(message["content"]) for message in messages), "messages")
    text = render_prompt(state, messages, tools, options)
    check_text_length(state, len(text), "messages")
    reasoning = reasoning_request(state, text, options)
    include_reasoning = fields.boolean("include_reasoning", True)
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
    params = reasoning_params(constrain(params, tools, body), reasoning, body)
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
        echoed_contents=[echoed_content(messages) if echo else ""],
        beams=beam_search_params(fields, params, n),
        priority=priority_field(state, fields),
        **vllm_output_fields(fields, include_usage),
        reasonings=[] if reasoning is None else [reasoning],
        include_reasoning=include_reasoning,
    )


def parse_chat_batch(state, body: dict) -> OpenAIRequest:
    """vLLM's ``/v1/chat/completions/batch``: ``messages`` is a list of conversations, each
    parsed as a chat request with the body's other fields; one answer, a choice per
    conversation (and ``n``). Not streamed. Any conversation refused refuses the batch before
    anything is queued."""
    fields = Fields(body)
    conversations = fields.data.get("messages")
    if (
        not isinstance(conversations, list)
        or not conversations
        or not all(isinstance(c, list) for c in conversations)
    ):
        raise fields.error("messages", "must be a non-empty list of conversations (message lists)")
    if len(conversations) > MAX_CHOICES:
        raise RequestError(
            f"`messages` may hold at most {MAX_CHOICES} conversations", param="messages"
        )
    if fields.boolean("stream", False):
        raise RequestError("a batch of conversations is not streamed", param="stream")
    parsed = []
    for i, conversation in enumerate(conversations):
        try:
            parsed.append(parse_chat(state, {**body, "messages": conversation}))
        except RequestError as error:
            where = error.param
            if where and where.startswith("messages"):  # messages[j] of conversation i
                where = f"messages[{i}]" + where[len("messages") :]
            raise RequestError(
                f"conversation {i}: {error.message}", param=where, kind=error.kind
            ) from None
    first = parsed[0]
    if first.n * len(parsed) > MAX_CHOICES:
        raise RequestError(f"conversations x n must be <= {MAX_CHOICES}", param="n")
    return dataclasses.replace(
        first,
        prompts=[p.prompts[0] for p in parsed],
        prompt_texts=[p.prompt_texts[0] for p in parsed],
        params=[p.params[0] for p in parsed],
        echoed_contents=[p.echoed_contents[0] for p in parsed],
        reasonings=[r for p in parsed for r in p.reasonings],
        beams=None if first.beams is None else [p.beams[0] for p in parsed],
    )


def template_options(fields: Fields, messages: list[dict]) -> ChatTemplateOptions:
    """vLLM's ``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs``
    (400 naming the field: both flags true, nothing to continue, bad kwargs)."""
    try:
        return ChatTemplateOptions.build(
            messages,
            add_generation_prompt=fields.data.get("add_generation_prompt"),
            continue_final_message=fields.data.get("continue_final_message"),
            chat_template_kwargs=fields.data.get("chat_template_kwargs"),
        )
    except ChatTemplateError as error:
        raise RequestError(str(error), param=error.param) from None


def echoed_content(messages: list[dict]) -> str:
    """What chat ``echo`` puts before the answer: the final message's text when it is the
    assistant's (the message continued), as vLLM."""
    last = messages[-1]
    return last["content"] if last["role"] == "assistant" else ""


def reasoning_fields(item: Fields, role: str) -> dict:
    """An assistant message's reasoning (vLLM's ``reasoning_content`` or ``reasoning``), kept for
    the chat template; a string or nothing."""
    if role != "assistant":
        return {}
    for key in ("reasoning_content", "reasoning"):
        text = item.string(key)
        if text is not None:
            return {"reasoning_content": text}
    return {}


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
                **reasoning_fields(item, role),
            }
        )
    return checked
