"""Beam search over ``AsyncLLM`` (the server's ``use_beam_search``), beside other requests.

vLLM's online beam search: each step every live beam is a one-token request asking for its top
``2 * beam_width`` logprobs, and the prefix cache gives each back its beam's full pages (shared
by every beam with that prefix); only a beam's last partial page is computed again. Ranking is
``LLM.beam_search``'s (``jaxgen.engine.decoding.beam_search``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from jaxgen.beam_search_params import BeamSearchParams, BeamSearchSequence, beam_search_score
from jaxgen.sampling_params import SamplingParams


async def beam_search(
    llm,
    prompt_token_ids: list[int],
    params: BeamSearchParams,
    new_request_id: Callable[[], str],
) -> list[BeamSearchSequence]:
    """The best ``params.beam_width`` sequences of one prompt, best first (text: the generated
    tokens decoded, special tokens skipped). ``llm`` is an ``AsyncLLM``; ``new_request_id``
    names each one-token request (so a drain or disconnect can abort it)."""
    eos_ids = set(llm.model_config.eos_token_ids)
    eos = set() if params.ignore_eos else eos_ids
    row_params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2 * params.beam_width)
    num_prompt = len(prompt_token_ids)

    def score(sequence: BeamSearchSequence) -> float:
        return beam_search_score(
            sequence.tokens, sequence.cum_logprob, eos_ids, params.length_penalty
        )

    beams = [BeamSearchSequence(list(prompt_token_ids), [], 0.0, num_prompt_tokens=num_prompt)]
    completed: list[BeamSearchSequence] = []
    for _ in range(params.max_tokens):
        if not beams:
            break
        entries = await asyncio.gather(
            *(_top_logprobs(llm, beam.tokens, row_params, new_request_id()) for beam in beams)
        )
        candidates = []
        for beam, entry in zip(beams, entries, strict=True):
            for token, logprob in entry.items():
                candidate = BeamSearchSequence(
                    beam.tokens + [token],
                    beam.logprobs + [entry],
                    beam.cum_logprob + logprob,
                    num_prompt_tokens=num_prompt,
                )
                if token in eos:
                    candidate.finish_reason, candidate.stop_reason = "stop", token
                    completed.append(candidate)
                else:
                    candidates.append(candidate)
        beams = sorted(candidates, key=score, reverse=True)[: params.beam_width]
        if beams and len(beams[0].tokens) >= llm.max_model_len:
            break
    for beam in beams:
        beam.finish_reason = "length"
    best = sorted(completed + beams, key=score, reverse=True)[: params.beam_width]
    for sequence in best:
        sequence.text = llm.tokenizer.decode(sequence.output_token_ids, skip_special_tokens=True)
    return best


async def _top_logprobs(llm, tokens: list[int], params: SamplingParams, request_id: str) -> dict:
    """{token: raw logprob} of the top candidates after ``tokens``."""
    final = None
    async for output in llm.generate(
        None, params, request_id=request_id, delta=False, prompt_token_ids=tokens
    ):
        final = output
    if final is None or not final.outputs[0].logprobs:
        raise RuntimeError("beam search: the engine returned no logprobs")
    return final.outputs[0].logprobs[0]
