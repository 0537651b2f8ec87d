"""A request's host-side state: its sequences (``n`` samples), detokenizers, stop handling, metrics."""

from __future__ import annotations

import dataclasses
import time

from jaxgen.engine.detokenizer import IncrementalDetokenizer
from jaxgen.engine.sampling.sampling_tensors import SamplingRow, min_tokens_banned_ids
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus
from jaxgen.outputs import CompletionOutput, RequestOutput
from jaxgen.sampling_params import RequestOutputKind, SamplingParams


class Request:
    """Tracks text, logprobs and finish state for each of a request's sequences."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
        arrival_time: float | None = None,
        priority: int = 0,
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.stop_token_ids = set(params.stop_token_ids)
        room = max_model_len - len(prompt_token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self.seqs: list[Sequence] = []
        for i in range(params.n):
            # Seeded parallel samples must differ from each other: sample i uses seed + i.
            seq_params = (
                params
                if params.seed is None or i == 0
                else dataclasses.replace(params, seed=params.seed + i)
            )
            self.seqs.append(
                Sequence(
                    prompt_token_ids,
                    max_tokens=max_tokens,
                    request_id=request_id,
                    index=i,
                    params=seq_params,
                    arrival_time=self.arrival_time,
                    depends_on=self.seqs[0] if i > 0 else None,
                    priority=priority,
                )
            )
        self.detokenizers = [
            IncrementalDetokenizer(
                tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens
            )
            for _ in range(params.n)
        ]
        self.texts = [""] * params.n  # final-safe text (stop strings held back while streaming)
        self.logprobs: list[list[dict[int, float]]] = [[] for _ in range(params.n)]
        self.stop_reasons: list[str | int | None] = [None] * params.n
        self.errors: list[str | None] = [None] * params.n  # why a sample ended with "error"
        self.relaxed_keywords: list[str] = []  # what its grammar does not enforce
        self._max_stop_len = max((len(s) for s in params.stop), default=0)
        self.prompt_logprobs: list[dict[int, float] | None] | None = None
        self._prompt_logprobs_missing = 0
        # A draft model's request (``speculative.draft_model``): its prompt's last tokens are
        # this many output tokens of the sequence it drafts for, which its sampler counts as
        # output (penalties, the seeded draw's position), as the target's sampler does.
        self.outputs_in_prompt = 0
        self._prompt_logprobs_sent = False  # DELTA: reported once, complete
        self._sent = [(0, 0)] * params.n  # DELTA: (text characters, tokens) reported so far
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)
            self._prompt_logprobs_missing = len(self.prompt_token_ids) - 1
            self.seqs[0].wants_prompt_logprobs = self._prompt_logprobs_missing > 0

    def on_prompt_logprobs(self, entries: list[tuple[int, dict[int, float]]]) -> None:
        """Records prompt logprobs by position (a recomputed position keeps its first value);
        once every position has one, the first sequence may reuse cached pages again."""
        for position, entry in entries:
            if self.prompt_logprobs[position] is None:
                self.prompt_logprobs[position] = entry
                self._prompt_logprobs_missing -= 1
        if self._prompt_logprobs_missing == 0:
            self.seqs[0].wants_prompt_logprobs = False

    @property
    def finished(self) -> bool:
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                return False
        return True

    def banned_token_ids(self, seq: Sequence) -> list[int]:
        """Tokens that may not end the sequence yet (``min_tokens``)."""
        if len(seq.output_token_ids) >= self.params.min_tokens:
            return []
        return min_tokens_banned_ids(self.params, seq.num_generated, sorted(self.eos_token_ids))

    def sampling_row(self, seq: Sequence) -> SamplingRow:
        """What the sampler needs of ``seq`` for its next token."""
        if self.outputs_in_prompt:
            split = len(seq.prompt_token_ids) - self.outputs_in_prompt
            history = seq.prompt_token_ids[split:] + seq.output_token_ids
            return SamplingRow(seq.params, seq.prompt_token_ids[:split], history, [])
        if len(seq.output_token_ids) >= self.params.min_tokens:
            return SamplingRow(seq.params, seq.prompt_token_ids, seq.output_token_ids)
        return SamplingRow(
            seq.params, seq.prompt_token_ids, seq.output_token_ids, self.banned_token_ids(seq)
        )

    def on_token(self, seq: Sequence, logprobs: dict[int, float] | None) -> str | None:
        """Processes the token just appended to ``seq``; returns a finish reason or None."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        i = seq.index
        token = seq.output_token_ids[-1]
        if logprobs is not None:
            self.logprobs[i].append(logprobs)
        detok = self.detokenizers[i]
        num_generated = len(seq.output_token_ids)
        enough = num_generated >= self.params.min_tokens
        if enough and token in self.stop_token_ids:
            self.stop_reasons[i] = token
            detok.flush()
            return "stop"
        if enough and token in self.eos_token_ids:
            detok.flush()
            return "stop"
        detok.add_token(token)
        if self.params.stop and enough:
            text = detok.text
            search_from = max(0, len(self.texts[i]) - self._max_stop_len)
            hits = [(text.find(s, search_from), s) for s in self.params.stop]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, stop = min(hits)
                kept = len(stop) if self.params.include_stop_str_in_output else 0
                self.texts[i] = text[: pos + kept]
                self.stop_reasons[i] = stop
                return "stop"
        if num_generated >= seq.max_tokens:
            detok.flush()
            self.texts[i] = detok.text
            return "length"
        # Hold back a possible partial stop string from streaming.
        hold = self._max_stop_len - 1 if self.params.stop else 0
        self.texts[i] = detok.text[: len(detok.text) - hold] if hold > 0 else detok.text
        return None

    def finalize(self, seq: Sequence) -> None:
        """Fixes the text of a finished sequence (stop strings already cut)."""
        i = seq.index
        if self.stop_reasons[i] is None or isinstance(self.stop_reasons[i], int):
            self.detokenizers[i].flush()
            self.texts[i] = self.detokenizers[i].text
        if all(s.is_finished for s in self.seqs):
            self.finish_time = time.monotonic()

    def output(self) -> RequestOutput:
        """The output so far: all of it (``CUMULATIVE``, ``FINAL_ONLY``), or what is new since
        the last call (``DELTA``: its text, tokens and logprobs; prompt logprobs only first)."""
        delta = self.params.output_kind == RequestOutputKind.DELTA
        outs = []
        for seq in self.seqs:
            i = seq.index
            text, token_ids, logprobs = self.texts[i], seq.output_token_ids, self.logprobs[i]
            if delta:
                sent_text, sent_tokens = self._sent[i]
                self._sent[i] = (len(text), len(token_ids))
                text, token_ids = text[sent_text:], token_ids[sent_tokens:]
                logprobs = logprobs[sent_tokens:]
            outs.append(
                CompletionOutput(
                    index=i,
                    text=text,
                    token_ids=list(token_ids),
                    finish_reason=seq.finish_reason if seq.is_finished else None,
                    logprobs=list(logprobs) if self.params.logprobs is not None else None,
                    stop_reason=self.stop_reasons[i],
                    error=self.errors[i],
                )
            )
        metrics = {
            "arrival_time": self.arrival_time,
            "first_scheduled_time": self.seqs[0].first_scheduled_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "num_cached_tokens": self.seqs[0].num_cached_tokens,
        }
        prompt_logprobs = None
        if self.prompt_logprobs is not None and not delta:
            prompt_logprobs = list(self.prompt_logprobs)
        elif self.prompt_logprobs is not None and self._prompt_logprobs_missing == 0:
            if not self._prompt_logprobs_sent:  # DELTA: once, when every position has one
                prompt_logprobs = list(self.prompt_logprobs)
                self._prompt_logprobs_sent = True
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outs,
            finished=self.finished,
            metrics=metrics,
            prompt_logprobs=prompt_logprobs,
            relaxed_keywords=list(self.relaxed_keywords),
        )


def check_new_request(
    prompt_token_ids: list[int], params: SamplingParams, *, vocab_size: int, max_model_len: int
) -> None:
    """Raises ``ValueError`` for an empty or too long prompt, a token id outside the
    vocabulary, or a ``logit_bias`` key that is no token id."""
    if not prompt_token_ids:
        raise ValueError("prompt must not be empty")
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids must be integers in [0, {vocab_size}), got {bad[:5]}")
    bad = [t for t in params.logit_bias or () if t >= vocab_size]
    if bad:
        raise ValueError(f"logit_bias keys must be token ids in [0, {vocab_size}), got {bad[:5]}")
    if len(prompt_token_ids) >= max_model_len:
        raise ValueError(
            f"prompt has {len(prompt_token_ids)} tokens; max_model_len is {max_model_len}"
        )
