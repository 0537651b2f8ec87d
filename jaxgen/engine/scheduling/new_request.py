"""A request as an engine is asked to queue it, and the one ``add_request`` signature.

``Engine.add_request(request_id, prompt, prompt_token_ids, params, arrival_time=None,
compiled_grammar=None, lora_request=None, priority=0)`` is the public call (as vLLM's ``LLMEngine.add_request``). Each engine
writes its ``add_request`` over one ``NewRequest`` and ``@takes_request_fields`` gives it that
call, so the signature is spelled here only; a wrapper engine hands the request on with
``NewRequest.add_to``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxgen.engine.scheduling.request import Request
    from jaxgen.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class NewRequest:
    """``add_request``'s arguments: a request no engine has accepted yet."""

    request_id: str
    prompt: str | None  # the text, when the caller had one (outputs carry it)
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float | None = None  # time.monotonic(); None: when it is queued
    # The matcher of params.structured_outputs compiled already (GrammarCompiler), else None.
    compiled_grammar: Any = None
    lora_request: Any = None  # a jaxgen.lora.LoRARequest, or None: the base model
    priority: int = 0  # lower first under scheduling_policy "priority" (vLLM's meaning)

    def add_to(self, engine) -> Request:
        """Queues this request on ``engine`` (an ``Engine``: how a wrapper hands the request on).
        ``lora_request`` and ``priority`` go only when set: an engine without adapters or
        priorities needs no such argument."""
        extra = {} if self.lora_request is None else {"lora_request": self.lora_request}
        if self.priority != 0:
            extra["priority"] = self.priority
        return engine.add_request(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            self.params,
            arrival_time=self.arrival_time,
            compiled_grammar=self.compiled_grammar,
            **extra,
        )


def takes_request_fields(
    add: Callable[[Any, NewRequest], Request],
) -> Callable[..., Request]:
    """Makes ``add(engine, new: NewRequest)`` an ``add_request`` called with the request's
    fields, positionally or by name, as ``NewRequest`` lists them."""

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        compiled_grammar=None,
        lora_request=None,
        priority: int = 0,
    ) -> Request:
        fields = NewRequest(
            request_id,
            prompt,
            prompt_token_ids,
            params,
            arrival_time,
            compiled_grammar,
            lora_request,
            priority,
        )
        return add(self, fields)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(add_request, name, getattr(add, name))
    return add_request
