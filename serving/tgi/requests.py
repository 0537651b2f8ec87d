"""TGI request bodies (``/generate``, ``/generate_stream``), parsed and checked."""

from __future__ import annotations

import dataclasses

from jaxgen.lora import LoRARequest
from jaxgen.sampling_params import SamplingParams
from serving.common import encode_text, random_seed
from serving.sampling_fields import defaults_for_absent, read_tgi_fields
from serving.structured_output_requests import tgi_grammar
from serving.validation import (
    Fields,
    RequestError,
    build_sampling_params,
    check_lengths,
    check_token_ids,
)

PARAM_NAMES = {
    "max_tokens": "max_new_tokens",
    "logprobs": "top_n_tokens",
    "presence_penalty": "presence_penalty",
}


MAX_TOP_N_TOKENS = 20


DEFAULT_MAX_NEW_TOKENS = 100  # TGI's default


@dataclasses.dataclass
class TgiRequest:
    """A checked TGI request. ``best_of`` > 1: ``sequence_params`` holds one ``SamplingParams``
    per sequence, each with a seed of its own (``params`` is the first)."""

    inputs: str
    prompt_token_ids: list[int]
    params: SamplingParams
    details: bool
    decoder_input_details: bool
    return_full_text: bool
    top_n_tokens: int
    seed: int | None
    best_of: int = 1
    sequence_params: list[SamplingParams] = dataclasses.field(default_factory=list)
    lora_request: LoRARequest | None = None  # ``parameters.adapter_id``'s adapter; None: base


def parse_request(state, body: dict) -> TgiRequest:
    """Checks a TGI body ``{"inputs", "parameters": {...}}`` against the server's limits."""
    limits = state.limits
    fields = Fields(body)
    inputs = fields.data.get("inputs")
    if not isinstance(inputs, str):
        raise fields.error("inputs", "must be a string")
    p = Fields(fields.data.get("parameters"), "parameters")
    lora_request = tgi_adapter(state, p)
    p.unsupported("watermark", allowed=lambda v: v is False)
    p.unsupported("typical_p", allowed=lambda v: isinstance(v, (int, float)) and v >= 1.0)
    max_new_tokens = p.integer("max_new_tokens", minimum=1)
    plain = read_tgi_fields(p)  # temperature, top_k, top_p, repetition and frequency penalties
    temperature, top_k, top_p = plain["temperature"], plain["top_k"], plain["top_p"]
    do_sample = p.boolean("do_sample", False)
    stop = p.string_list("stop", max_items=limits.max_stop_sequences)
    seed = p.seed()
    details = p.boolean("details", False)
    decoder_input_details = p.boolean("decoder_input_details", False)
    return_full_text = p.boolean("return_full_text", False)
    truncate = p.integer("truncate", minimum=1)
    top_n_tokens = p.integer("top_n_tokens", 0, minimum=0, maximum=MAX_TOP_N_TOKENS)
    best_of = p.integer("best_of", 1, minimum=1, maximum=limits.max_best_of)

    # With ``truncate`` a long input is cut after tokenizing: no length check before.
    prompt_token_ids = encode_text(state, inputs, "inputs", check=truncate is None)
    if truncate is not None:
        prompt_token_ids = prompt_token_ids[-truncate:]
    check_token_ids(prompt_token_ids or [0], limits.vocab_size, "inputs")
    budget = check_lengths(
        len(prompt_token_ids),
        max_new_tokens,
        limits,
        input_name="inputs",
        output_name="max_new_tokens",
    )
    max_new_tokens = min(budget, DEFAULT_MAX_NEW_TOKENS) if max_new_tokens is None else budget
    # TGI samples when asked to or when any sampling knob is set.
    sampling = (
        do_sample
        or (temperature is not None and temperature != 1.0)
        or bool(top_k)
        or (top_p is not None and top_p < 1.0)
    )
    if temperature == 0.0:
        sampling = False
    check_best_of(p, best_of, sampling, seed)
    if sampling and seed is None:
        seed = random_seed()
    plain = defaults_for_absent(plain)
    if not sampling:
        plain["temperature"] = 0.0
    params = build_sampling_params(
        PARAM_NAMES,
        **plain,
        max_tokens=max_new_tokens,
        stop=stop,
        seed=seed if sampling else None,
        logprobs=top_n_tokens,
        structured_outputs=tgi_grammar(p),
        prompt_logprobs=0 if decoder_input_details and details else None,
    )
    sequence_params = [params] + [
        dataclasses.replace(params, seed=random_seed()) for _ in range(best_of - 1)
    ]
    return TgiRequest(
        inputs,
        prompt_token_ids,
        params,
        details,
        decoder_input_details,
        return_full_text,
        top_n_tokens,
        seed if sampling else None,
        best_of,
        sequence_params,
        lora_request,
    )


def tgi_adapter(state, p: Fields) -> LoRARequest | None:
    """TGI's ``parameters.adapter_id``: a LoRA adapter the server offers (``--lora-modules``,
    ``/v1/load_lora_adapter``), or absent / the served model's name for the base model."""
    adapter = p.data.get("adapter_id")
    if adapter is None or (isinstance(adapter, str) and state.settings.serves_model(adapter)):
        return None
    if not isinstance(adapter, str):
        raise p.error("adapter_id", "must be a string")
    lora = state.loras.get(adapter)
    if lora is None:
        offered = ", ".join(sorted(state.loras.by_name)) or "none"
        raise p.error("adapter_id", f"names no loaded adapter (loaded: {offered})")
    return lora


def check_best_of(p: Fields, best_of: int, sampling: bool, seed: int | None) -> None:
    """TGI's rules for ``best_of`` > 1 (its router's messages): the sequences must be sampled,
    each with a seed of its own, so a request's ``seed`` is refused."""
    if best_of == 1:
        return
    if not sampling:
        raise RequestError("you must use sampling when `best_of` is > 1", param=p.name("best_of"))
    if seed is not None:
        raise RequestError("`seed` must not be set when `best_of` > 1", param=p.name("seed"))
