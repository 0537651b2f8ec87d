"""vLLM's ``use_beam_search`` on the OpenAI routes: the request's beam parameters, checked, and
the generation that runs one prompt's beam search (``jaxgen.engine.decoding.async_beam_search``)."""

from __future__ import annotations

from jaxgen.beam_search_params import MAX_BEAM_WIDTH, MAX_LENGTH_PENALTY, BeamSearchParams
from jaxgen.engine.decoding.async_beam_search import beam_search
from serving.generation import (
    Completion,
    Delta,
    GenerationAborted,
    GenerationFailed,
    GenerationResult,
)
from serving.sampling_fields import beam_neutral_values
from serving.validation import Fields, RequestError

# Fields whose effect beam search cannot honour: set to anything but their neutral value, the
# request is refused (400 naming the field) rather than silently answered without them.
NEUTRAL = {
    "stop": (None, [], ""),
    "logprobs": (None, False),
    "top_logprobs": (None,),
    "echo": (None, False),
    "prompt_logprobs": (None,),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "tools": (None, []),
    "logit_bias": (None, {}),
    **beam_neutral_values(),  # the penalties, top_p, top_k, min_p, min_tokens
    "seed": (None,),
    "stop_token_ids": (None, []),
    "early_stopping": (None, False),
}


def uses_beam_search(fields: Fields) -> bool:
    return fields.boolean("use_beam_search", False)


def beam_search_params(fields: Fields, params: list, n: int) -> list[BeamSearchParams] | None:
    """One ``BeamSearchParams`` per prompt when the body asks for ``use_beam_search``: the beam
    width is ``best_of`` (default ``n``, at least ``n``); ``n`` beams are returned. ``params``:
    the prompts' ``SamplingParams`` (their checked ``max_tokens`` budget and ``ignore_eos``)."""
    if not uses_beam_search(fields):
        return None
    width = fields.integer("best_of", n, minimum=n, maximum=MAX_BEAM_WIDTH)
    length_penalty = fields.number(
        "length_penalty", 1.0, minimum=-MAX_LENGTH_PENALTY, maximum=MAX_LENGTH_PENALTY
    )
    temperature = fields.data.get("temperature")
    if temperature not in (None, 0, 0.0):
        raise RequestError(
            "`temperature` must be 0 or absent with `use_beam_search` (beams are scored with "
            "the model's raw log-probabilities)",
            param="temperature",
        )
    for name, neutral in NEUTRAL.items():
        value = fields.data.get(name)
        if not any(value == v and type(value) is type(v) for v in neutral) and value is not None:
            raise RequestError(f"`{name}` is not supported with `use_beam_search`", param=name)
    return [
        BeamSearchParams(
            beam_width=width,
            max_tokens=p.max_tokens,
            ignore_eos=p.ignore_eos,
            length_penalty=length_penalty,
        )
        for p in params
    ]


class BeamGeneration:
    """One prompt's beam search, answered as ``n`` completions (the best beams, best first).
    Streamed as vLLM streams beam search: nothing until the search ends, then one delta per
    completion (its whole text and finish reason)."""

    def __init__(self, state, ticket, prompt_token_ids: list[int], params: BeamSearchParams, n):
        self.state = state
        self.ticket = ticket
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.n = n
        self.prompt_logprobs = None
        self.completions: list[Completion] = []
        self.cut_reason: str | None = None  # "abort" or "error" when the search was cut short

    @property
    def result(self) -> GenerationResult:
        return GenerationResult(self.prompt_token_ids, self.completions)

    async def run(self) -> GenerationResult:
        self.cut_reason = "abort"
        try:
            best = await beam_search(
                self.state.llm, self.prompt_token_ids, self.params, self.ticket.new_request_id
            )
        except ValueError as error:
            raise RequestError(str(error)) from None
        except RuntimeError as error:
            if "shut down" in str(error):
                raise GenerationAborted("the engine is shut down") from None
            self.cut_reason = "error"
            raise GenerationFailed(str(error)) from None
        self.cut_reason = None
        self.completions = [
            Completion(
                index=i,
                text=sequence.text,
                token_ids=sequence.output_token_ids,
                finish_reason=sequence.finish_reason,
                stop_reason=sequence.stop_reason,
            )
            for i, sequence in enumerate(best[: self.n])
        ]
        return self.result

    async def stream(self):
        """Yields, once the search ends, one list of one ``Delta`` per completion."""
        await self.run()
        for completion in self.completions:
            ids = completion.token_ids
            texts = [""] * (len(ids) - 1) + [completion.text] if ids else []
            yield [
                Delta(
                    completion.index,
                    completion.text,
                    ids,
                    texts,
                    None,
                    completion.finish_reason,
                    completion.stop_reason,
                )
            ]

    def cut_deltas(self) -> list[Delta]:
        """A stream cut before the search ended: every completion ends with the reason."""
        if self.cut_reason is None:
            return []
        return [Delta(i, "", [], [], None, self.cut_reason) for i in range(self.n)]
