"""Which running sequences speculate this step, their drafts, back-off and acceptance counters.
Plain Python: never imports jax."""

from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

from jaxgen.config.speculative_config import SpeculativeConfig
from jaxgen.engine.decoding.speculative.draft_cost import DraftCost, best_length
from jaxgen.engine.decoding.speculative.ngram import NgramProposer
from jaxgen.engine.sampling.sampling_tensors import is_greedy
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus

# Until the engine has measured what drafts cost: after a draft of which nothing was accepted,
# a sequence drafts nothing for this many steps, doubling with each such draft in a row (reset
# by an accepted token), and its drafts' length follows its acceptance: after a draft cut at a
# rejection the next is one token longer than what was accepted, after a wholly accepted one
# twice as long (up to k).
FIRST_BACKOFF, MAX_BACKOFF = 2, 64
# Once it has (``DraftCost``), a draft is as long as gives the most tokens per second at the
# sequence's acceptance rate (``best_length``; counts decayed by DECAY a draft, starting from
# PRIOR_TRIALS at the engine's rate), and a sequence backs off only where no length pays: as
# after a draft with nothing accepted, but four times longer at each such draft in a row (up to
# UNPAID_MAX_BACKOFF). Where proposals mostly miss, speculation costs a one-token probe now
# and then.
DECAY, PRIOR_TRIALS = 0.9, 0.5
UNPAID_GROWTH, UNPAID_MAX_BACKOFF = 4, 256
# Measured costs are only as good as the lengths drafted: a length whose first steps ran slow
# (a shape's first runs) or that a line through two others priced high would never be drafted,
# so never measured again (at k = 8 every draft stayed 2 long, its 8-long ones having cost 7
# steps in their first two runs against 4 after). So every EXPLORE_EVERY-th proposal takes the
# length that pays best when each length measured fewer than EXPLORE_STEPS times costs no more
# than the cheapest per-token cost measured (``DraftCost.optimistic``): a few dear drafts in an
# engine's life, each re-measuring the length it tried.
EXPLORE_EVERY, EXPLORE_STEPS = 8, 4


@dataclasses.dataclass
class Draft:
    """A sequence's draft tokens, appended to it for the verify step."""

    seq: Sequence
    tokens: list[int]
    num_tokens: int  # the sequence's tokens before the draft
    # An unseeded sampled row's draws at the draft's positions, the draft model's and the
    # verify step's: one 32-bit seed (``Candidate.seed``); None: the step's own seed.
    seed: int | None = None

    def cut(self, num_tokens: int) -> Draft:
        """This draft's first ``num_tokens`` tokens (a grammar refused the next one)."""
        return dataclasses.replace(self, tokens=self.tokens[:num_tokens])


class Candidate(NamedTuple):
    """A sequence the proposer may draft up to ``k`` tokens for. ``seed``: for an unseeded
    sampled row of a proposer that samples its drafts, a fresh 32-bit seed that its draft and
    the verify step's draws at the same positions share (a seeded row shares its own seed)."""

    seq: Sequence
    k: int
    seed: int | None = None


@dataclasses.dataclass
class _Backoff:
    length: int  # the next draft's length at most
    skip: int = 0  # steps left without drafting
    misses: int = 0  # drafts in a row with nothing accepted (or not paying)
    accepted: float = 0.0  # draft tokens accepted, decayed
    trials: float = 0.0  # draft tokens accepted or rejected (not those after a rejection)


class Speculator:
    """Proposes drafts for the decode rows that can be verified exactly, and counts.

    ``proposer``: ``propose(candidates: [Candidate], token_budget) -> [draft tokens]``, one list
    each (n-gram prompt lookup by default, or ``draft_model.DraftModelProposer``); one whose
    ``samples_drafts`` is true gets a seed for each unseeded sampled row (``Candidate``).

    ``idle_backoff`` (asynchronous scheduling): a sequence for which nothing is proposed backs
    off as after a wholly rejected draft. There, a step that may draft runs synchronously (the
    draft needs the last token on the host), so a sequence that keeps proposing nothing would
    keep every step synchronous."""

    def __init__(
        self,
        config: SpeculativeConfig,
        proposer=None,
        *,
        idle_backoff: bool = False,
        seed: int = 0,
    ):
        """``seed``: the engine's, from which unseeded rows' draft seeds are drawn."""
        self.config = config
        self.proposer = proposer or NgramProposer(
            config.prompt_lookup_min, config.prompt_lookup_max
        )
        self.idle_backoff = idle_backoff
        self.seeds = (
            random.Random(seed) if getattr(self.proposer, "samples_drafts", False) else None
        )
        self.backoff: dict[int, _Backoff] = {}
        self.num_drafts = 0  # drafts verified
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_trials = 0  # draft tokens accepted or rejected
        self.accepted_per_position = [0] * config.num_speculative_tokens
        self.cost = DraftCost()
        self.rows = 1  # decode rows of the step the last drafts were proposed for
        self.num_proposals = 0  # candidates given a length since costs were measured

    @property
    def draft_engine(self):
        """The draft model's engine (method "draft_model"), else None: it sleeps and wakes with
        the target's."""
        return getattr(self.proposer, "engine", None)

    def propose(
        self, running: list[Sequence], allocator, token_budget: int, max_model_len: int
    ) -> list[Draft]:
        """Drafts for ``running`` sequences, without appending them. A draft needs a decoding
        sequence (a constrained one's draft is cut to its grammar afterwards), the room in
        ``max_tokens`` and ``max_model_len``, its pages free now (speculation never preempts)
        and its tokens in ``token_budget`` beside one token for every running sequence."""
        live = {seq.seq_id for seq in running}
        for seq_id in [s for s in self.backoff if s not in live]:
            del self.backoff[seq_id]
        spare_tokens = token_budget - len(running)
        spare_pages = allocator.num_free_pages
        self.rows = max(len(running), 1)
        candidates = []
        for seq in running:
            state = self._state_of(seq.seq_id)
            if state.skip > 0:
                state.skip -= 1
                continue
            if not _verifiable(seq):
                continue
            k = min(
                state.length,
                seq.max_tokens - seq.num_generated - 1,
                max_model_len - seq.num_tokens - 1,
                spare_tokens,
            )
            if k >= 1:
                # A draft that would not pay is still probed one token long now and then.
                k = max(self._length(state, k), 1)
                candidates.append(Candidate(seq, k, self._draw_seed(seq)))
        drafts = []
        proposals = self.proposer.propose(candidates, spare_tokens) if candidates else []
        for (seq, _, seed), tokens in zip(candidates, proposals, strict=True):
            tokens = tokens[: max(spare_tokens, 0)]
            if not tokens:
                if self.idle_backoff:
                    _miss(self._state_of(seq.seq_id))
                continue
            pages = allocator.pages_needed(seq.num_tokens + len(tokens)) - len(seq.block_table)
            if pages > spare_pages:
                continue
            spare_pages -= max(pages, 0)
            spare_tokens -= len(tokens)
            drafts.append(Draft(seq, tokens, seq.num_tokens, seed))
        return drafts

    def _length(self, state: _Backoff, k: int) -> int:
        """The draft length, up to ``k``, that pays best at the sequence's acceptance
        (``best_length``); every EXPLORE_EVERY-th time, with little-measured lengths priced
        optimistically."""
        acceptance = self.acceptance(state)
        length = best_length(acceptance, self.cost, self.rows, k)
        if self.cost.relative(self.rows, 1) is None:  # nothing measured yet
            return length
        self.num_proposals += 1
        if self.num_proposals % EXPLORE_EVERY:
            return length
        optimistic = self.cost.optimistic(self.rows, EXPLORE_STEPS)
        return best_length(acceptance, optimistic, self.rows, k)

    def _draw_seed(self, seq: Sequence) -> int | None:
        """A fresh seed for an unseeded sampled row's draft (``Candidate.seed``), else None."""
        params = seq.params
        if self.seeds is None or params.seed is not None or is_greedy(params):
            return None
        return self.seeds.getrandbits(32)

    def record(self, draft: Draft, accepted: int) -> None:
        """Counts a verified draft of which ``accepted`` tokens were kept; sets the sequence's
        next draft length; backs off on none, or while the sequence's drafts do not pay."""
        trials = accepted + (accepted < len(draft.tokens))
        self.num_drafts += 1
        self.num_draft_tokens += len(draft.tokens)
        self.num_accepted_tokens += accepted
        self.num_trials += trials
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        state = self._state_of(draft.seq.seq_id)
        state.accepted = DECAY * state.accepted + accepted
        state.trials = DECAY * state.trials + trials
        if self.cost.relative(self.rows, 1) is not None:
            # Costs measured: the next draft is as long as pays (``best_length``), and the
            # sequence backs off only while no length does.
            state.length = self.config.num_speculative_tokens
            if self._unpaid(state):
                _miss(state, UNPAID_GROWTH, UNPAID_MAX_BACKOFF)
            else:
                state.misses = 0
            return
        if accepted == len(draft.tokens):
            state.length = min(2 * state.length, self.config.num_speculative_tokens)
        else:
            state.length = accepted + 1
        if accepted:
            state.misses = 0
        else:
            _miss(state)

    def _unpaid(self, state: _Backoff) -> bool:
        """Whether drafts are measured not to pay at the sequence's acceptance, at any length."""
        length = self.config.num_speculative_tokens
        return best_length(self.acceptance(state), self.cost, self.rows, length) == 0

    def acceptance(self, state: _Backoff) -> float:
        """A sequence's chance that a draft token is accepted after an accepted one: its own
        decayed counts, with PRIOR_TRIALS at the engine's rate (1 before any draft)."""
        engine_rate = self.num_accepted_tokens / self.num_trials if self.num_trials else 1.0
        return (state.accepted + PRIOR_TRIALS * engine_rate) / (state.trials + PRIOR_TRIALS)

    def observe_step(self, seconds: float, rows: int, drafted_tokens: int) -> None:
        """A step of ``rows`` decode rows, ``drafted_tokens`` of its tokens drafts, took
        ``seconds``: what a drafted token costs (``DraftCost``)."""
        self.cost.observe(seconds, rows, drafted_tokens)

    def _state_of(self, seq_id: int) -> _Backoff:
        state = self.backoff.get(seq_id)
        if state is None:
            state = self.backoff[seq_id] = _Backoff(length=self.config.num_speculative_tokens)
        return state

    def may_draft(self, seqs) -> bool:
        """Whether one of ``seqs`` may be given a draft at its next step (not backing off, its
        output verifiable): asynchronous scheduling then runs that step synchronously."""
        for seq in seqs:
            state = self.backoff.get(seq.seq_id)
            if (state is None or state.skip == 0) and _may_ever_verify(seq):
                return True
        return False

    def tick(self, seqs) -> None:
        """A step without drafts ran ``seqs`` (asynchronous scheduling): one step less of each
        one's back-off, as ``propose`` counts them."""
        for seq in seqs:
            state = self.backoff.get(seq.seq_id)
            if state is not None and state.skip > 0:
                state.skip -= 1

    def pause(self, seq: Sequence) -> None:
        """``seq`` drafts nothing next step (its verify row was cut short or preempted)."""
        state = self._state_of(seq.seq_id)
        state.skip = max(state.skip, 1)

    def stats(self) -> dict:
        """vLLM's spec-decode counters, and the rates they give."""
        return {
            "spec_decode_method": self.config.method,
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_position),
            "spec_decode_acceptance_rate": self.num_accepted_tokens / max(self.num_draft_tokens, 1),
            # tokens a verified sequence gained per step: accepted drafts plus the target's own
            "spec_decode_mean_acceptance_length": 1
            + self.num_accepted_tokens / max(self.num_drafts, 1),
            # a drafted token's measured cost in steps without drafts (None: not yet known)
            "spec_decode_draft_token_cost": self.cost.ratio,
        }


def _miss(state: _Backoff, growth: int = 2, longest: int = MAX_BACKOFF) -> None:
    state.skip = min(FIRST_BACKOFF * growth**state.misses, longest)
    state.misses += 1


def _may_ever_verify(seq: Sequence) -> bool:
    """What of ``_verifiable`` holds for the sequence whatever its progress."""
    return not seq.is_finished and not seq.wants_prompt_logprobs and seq.params is not None


def _verifiable(seq: Sequence) -> bool:
    """Whether ``seq`` decodes next and its draft positions can be sampled exactly: greedy or
    sampled, with penalties, logit bias, ``min_tokens``, logprobs (``verify_sampling``) and
    structured output (``grammar_drafts``), but no prompt logprobs still to compute."""
    return (
        seq.status == SequenceStatus.RUNNING
        and seq.num_uncomputed_tokens == 1
        and seq.num_computed_tokens >= seq.num_prompt_tokens
        and _may_ever_verify(seq)
    )
