"""Per-sequence token state. Plain Python: never imports jax."""

from __future__ import annotations

import enum
import itertools
import time

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One generated sequence: its tokens, how many have KV in the pool, and its pages."""

    def __init__(
        self,
        prompt_token_ids: list[int],
        *,
        max_tokens: int,
        request_id: str = "",
        index: int = 0,
        params=None,
        arrival_time: float | None = None,
        depends_on: Sequence | None = None,
        priority: int = 0,
    ):
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.index = index  # sample index within its request (n > 1)
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the pool
        self.num_cached_tokens = 0  # of those, tokens reused from the prefix cache
        self.block_table: list[int] = []  # page ids, in order
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority  # lower first under the ``priority`` scheduling policy
        self.first_scheduled_time: float | None = None
        self.depends_on = depends_on  # a sibling whose prompt pages this one waits to share
        self.num_preemptions = 0
        # LongRoPE: its K/V are rotated with the long factors (set by the scheduler).
        self.long_rope = False
        # Multi-LoRA (``jaxgen.lora``): the adapter's id (0: none), what its K/V depend on
        # besides tokens (the prefix cache's chain root: one per load of an adapter), and the
        # device slot of its adapter in the next step (set by the engine, -1: none).
        self.lora_int_id = 0
        self.lora_key: tuple | None = None
        self.lora_slot = -1
        self.finish_reason: str | None = None
        # Set by its ``Request``: compute every prompt position (no prefix-cache reuse) until
        # the request has the prompt logprobs it asked for (``prompt_logprobs.py``).
        self.wants_prompt_logprobs = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def token_at(self, position: int) -> int:
        if position < len(self.prompt_token_ids):
            return self.prompt_token_ids[position]
        return self.output_token_ids[position - len(self.prompt_token_ids)]

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, pages={len(self.block_table)})"
        )
