"""The engine interface: what ``LLM``, ``AsyncLLM``, the server and ``jaxgen bench`` drive.

``LLMEngine`` (one model on one device or mesh), ``ReplicatedEngine`` (data-parallel replicas)
and ``LeaderEngine`` (one engine over several hosts) each subclass ``Engine`` and implement
every member explicitly; ``add_request`` over one ``NewRequest`` (``new_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from jaxgen.engine.scheduling.new_request import NewRequest, takes_request_fields

if TYPE_CHECKING:
    from jaxgen.config.engine_config import EngineConfig
    from jaxgen.engine.scheduling.batching import BatchingPlan
    from jaxgen.engine.scheduling.request import Request
    from jaxgen.outputs import RequestOutput
    from jaxgen.sampling_params import SamplingParams


class Engine(Protocol):
    """Requests in, one ``step()`` at a time, outputs out."""

    loaded: Any  # LoadedModel: the model's config, tokenizer, graph and parameters
    config: EngineConfig
    tokenizer: Any
    max_model_len: int
    num_steps: int  # steps that ran
    last_batch_size: int  # sequences in the last step
    batching: BatchingPlan  # what the batching mode means: slots, token budget, scheduling
    requests: Mapping[str, Request]  # the unfinished requests, by id

    @property
    def params(self) -> Any:
        """The placed parameter pytree (an ``nnx.State``) as loaded."""
        ...

    @takes_request_fields
    def add_request(self, new: NewRequest) -> Request:
        """Queues a request; ``ValueError`` for one that cannot run. Called with the request's
        fields: ``add_request(request_id, prompt, prompt_token_ids, params, arrival_time=None,
        compiled_grammar=None, lora_request=None, priority=0)``."""
        ...

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stops a request; its final output, or None if unknown."""
        ...

    def has_unfinished(self) -> bool:
        """Whether a request is queued or running, or a step is still to be read."""
        ...

    def step(self) -> list[RequestOutput]:
        """One iteration; the outputs of the requests that moved."""
        ...

    def precompile(self, sampling_params: list[SamplingParams] | None = None) -> int:
        """Compiles every step shape before requests arrive; returns the compiles."""
        ...

    def stats(self) -> dict:
        """Pool, queue and step counters."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forgets every cached prompt page (a benchmark's warm pass starts without reuse)."""
        ...

    def update_weights(self, params) -> None:
        """Runs on new weights (a tree in the model's naming) from the next step, between
        steps of an idle engine; ``ValueError`` naming the first parameter that does not fit
        (the old weights stay)."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Frees the KV pool and the weights on the devices (1: weights kept on the host, 2:
        discarded), vLLM's sleep mode; an idle engine only."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Takes back what ``sleep`` freed ("weights", "kv_cache"; None: both)."""
        ...

    def is_sleeping(self) -> bool:
        """Whether any part sleeps (requests are refused meanwhile)."""
        ...

    def shutdown(self) -> None:
        """Releases what the engine holds besides memory (threads, followers)."""
        ...
