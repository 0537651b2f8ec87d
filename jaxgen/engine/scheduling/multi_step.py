"""Whether steps may run without the host between them.

Multi-step decoding (``num_scheduler_steps``) runs several decode steps in one call, and
asynchronous scheduling plans the next step before the host has read this one's tokens: both
hold only while no sequence needs its tokens on the host. ``steps_without_host`` is that one
answer per sequence: multi-step decoding asks it for ``num_scheduler_steps`` tokens,
asynchronous scheduling for 2 (the token in flight and the next).
"""

from __future__ import annotations

import itertools
from collections.abc import Container

from jaxgen.engine.sampling.sampling_tensors import uses_penalties
from jaxgen.engine.scheduling.scheduler import Scheduler, SchedulerOutput
from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.executor import DispatchedStep


def needs_host(seq: Sequence, grammars: Container[int], *, static_bans: bool = True) -> bool:
    """Whether ``seq``'s next token can only be sampled once its last one is on the host:
    penalties (they count its tokens), a grammar (its matcher advances on the host) and, with
    ``static_bans``, ``min_tokens`` still banning its stop tokens."""
    if seq.seq_id in grammars or uses_penalties(seq.params):
        return True
    return static_bans and seq.num_generated < seq.params.min_tokens


def steps_without_host(
    seq: Sequence,
    steps: int,
    *,
    grammars: Container[int],
    max_model_len: int,
    static_bans: bool = True,
) -> bool:
    """Whether ``seq`` may get ``steps`` more tokens without the host between them: nothing
    needs its tokens there (``needs_host``) and neither of its length limits (``max_tokens``,
    ``max_model_len``) ends it before the last of them."""
    if needs_host(seq, grammars, static_bans=static_bans):
        return False
    return seq.num_generated + steps <= seq.max_tokens and seq.num_tokens + steps <= max_model_len


def may_step_ahead(
    scheduler: Scheduler, current: DispatchedStep, *, grammars: Container[int], max_model_len: int
) -> bool:
    """Whether the step after ``current`` can be planned before ``current``'s tokens are known:
    no sequence needs its tokens on the host to be scheduled or sampled (penalties, grammars,
    LongRoPE's recompute), and each sequence ``current`` completes has room for its token and
    the next (its length limits), so the next step holds no row that cannot run. ``min_tokens``
    does not matter here: the bans are on the device with the step."""
    if scheduler.config.long_rope_threshold is not None:
        return False
    for seq in itertools.chain(scheduler.running, scheduler.waiting):
        if needs_host(seq, grammars, static_bans=False):
            return False
    return all(
        steps_without_host(
            seq, 2, grammars=grammars, max_model_len=max_model_len, static_bans=False
        )
        for seq in current.live_seqs()
    )


def decode_steps_for(
    scheduler: Scheduler,
    scheduled: SchedulerOutput,
    steps: int,
    *,
    grammars: Container[int],
    max_model_len: int,
) -> int:
    """How many decode steps the call of ``scheduled`` runs: ``steps`` (``num_scheduler_steps``)
    when every sequence in it decodes and may run that many without the host, no request waits
    to be admitted, LongRoPE is off, and the pool holds pages for them all (allocated here);
    else 1."""
    if steps == 1 or scheduler.waiting or scheduler.config.long_rope_threshold is not None:
        return 1
    for item in scheduled.scheduled:
        if not item.is_decode or item.seq.params is None:
            return 1
        if not steps_without_host(item.seq, steps, grammars=grammars, max_model_len=max_model_len):
            return 1
    for item in scheduled.scheduled:
        if not scheduler.allocator.allocate(item.seq, item.seq.num_computed_tokens + steps):
            return 1
    return steps
