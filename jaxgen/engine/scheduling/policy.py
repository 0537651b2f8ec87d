"""The order the scheduler serves sequences in (``scheduling_policy``). Plain Python: never
imports jax.

- ``fcfs`` (the default): first come, first served. The queue keeps arrival order, a preempted
  sequence goes back first in it, and the newest running sequence is the one preempted.
- ``priority`` (vLLM's ``--scheduling-policy priority``): each request's ``priority``, an int,
  lower first, then the earlier arrival. The queue is kept in that order (a preempted sequence
  goes back to its place in it), the running sequence preempted for pages is the one served
  last in that order (highest number, latest arrival), and a waiting sequence of a higher
  priority (a lower number) than a running one takes that one's slot or pages: the running one
  is preempted (recomputed from its tokens later), as pages running short preempt.
"""

from __future__ import annotations

import bisect
import numbers
from collections import deque
from collections.abc import Sequence as Seq

from jaxgen.engine.scheduling.sequence import Sequence


def check_priority(priority, policy: str) -> int:
    """``priority`` as an int: ``ValueError`` naming it for anything but an integer (a bool is
    none), or for a non-zero one when ``policy`` is not ``"priority"`` (as vLLM refuses it)."""
    if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
        raise ValueError(f"priority must be an int, got {priority!r}")
    priority = int(priority)
    if priority != 0 and policy != "priority":
        raise ValueError(
            f"priority {priority} needs scheduling_policy='priority' (priority scheduling is "
            f"not enabled: the engine schedules {policy})"
        )
    return priority


def priority_key(seq: Sequence) -> tuple:
    """The order of the ``priority`` policy: priority, then arrival (then creation)."""
    return (seq.priority, seq.arrival_time, seq.seq_id)


def _is_prefill(seq: Sequence) -> bool:
    return seq.num_uncomputed_tokens > 1


class FcfsPolicy:
    """First come, first served."""

    name = "fcfs"

    def queue(self, waiting: deque[Sequence], seq: Sequence) -> None:
        """A new sequence joins the queue: last."""
        waiting.append(seq)

    def requeue(self, waiting: deque[Sequence], seq: Sequence) -> None:
        """A preempted sequence goes back: first (it is recomputed before newer requests)."""
        waiting.appendleft(seq)

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        """The order running sequences get this step's pages and budget: decodes, then
        unfinished prefills, each oldest first."""
        return sorted(running, key=_is_prefill)

    def victim(self, running: list[Sequence]) -> Sequence:
        """The running sequence preempted when pages run out: the newest."""
        return running[-1]

    def displaced_by(self, seq: Sequence, running: Seq[Sequence]) -> Sequence | None:
        """The running sequence ``seq`` may preempt to be admitted: none under fcfs."""
        return None


class PriorityPolicy:
    """By ``(priority, arrival)``: lower numbers first; they preempt higher ones."""

    name = "priority"

    def queue(self, waiting: deque[Sequence], seq: Sequence) -> None:
        """A sequence joins the queue at its place by ``priority_key``."""
        if not waiting or priority_key(waiting[-1]) <= priority_key(seq):
            waiting.append(seq)  # the common case: arrivals of one priority
        else:
            bisect.insort(waiting, seq, key=priority_key)

    def requeue(self, waiting: deque[Sequence], seq: Sequence) -> None:
        """A preempted sequence goes back to its place (it keeps its arrival time)."""
        self.queue(waiting, seq)

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        """Decodes, then unfinished prefills, each by ``priority_key``."""
        return sorted(running, key=lambda seq: (_is_prefill(seq), priority_key(seq)))

    def victim(self, running: list[Sequence]) -> Sequence:
        """The running sequence served last: highest priority number, latest arrival."""
        return max(running, key=priority_key)

    def displaced_by(self, seq: Sequence, running: Seq[Sequence]) -> Sequence | None:
        """The running sequence ``seq`` preempts for a slot or pages: the one served last, if
        its priority is lower (a higher number) than ``seq``'s; else None. Never one of equal
        priority, so no two sequences take each other's place in turn."""
        if not running:
            return None
        victim = self.victim(list(running))
        return victim if victim.priority > seq.priority else None


# By name: ``EngineConfig``'s ``SCHEDULING_POLICIES`` (the configuration never imports the
# engine, and this module never imports jax, which the configuration does).
POLICIES = {"fcfs": FcfsPolicy, "priority": PriorityPolicy}


def scheduling_policy(name: str) -> FcfsPolicy | PriorityPolicy:
    """The policy called ``name`` (a key of ``POLICIES``)."""
    if name not in POLICIES:
        raise ValueError(f"scheduling_policy must be one of {tuple(POLICIES)}, got {name!r}")
    return POLICIES[name]()
