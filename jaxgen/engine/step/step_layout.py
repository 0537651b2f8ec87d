"""How a scheduled batch becomes the padded numpy inputs of one jitted step.

One ragged layout serves every backend: the step's tokens end to end, decode sequences first
(one row each), then prefill chunks, then bucket padding. ``AttentionMetadata`` describes them by
sequence (``cu_q_lens``, ``kv_lens``, block tables, ``num_seqs``) and by token (``slot_mapping``);
a backend derives any private view (per-row lengths, query blocks) inside its jitted attention.

Every array is padded to declared buckets, so a steady workload compiles nothing new: the token
count ``T`` (a power of two), the sequence slots ``S = min(T, seq_cap)`` (one logits row per
sequence: a function of ``T``), and the block-table width ``W``: full width (covering
``max_model_len``) for backends that read only each sequence's own pages (native CPU, Pallas TPU),
or the width bucket of the step's longest sequence for those that gather the whole width (XLA
reference, Pallas GPU). With full width a step's shape is its token bucket alone.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from jaxgen.engine.compiled.buckets import bucket_for, next_power_of_two, power_of_two_buckets
from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE
from jaxgen.engine.scheduling.scheduler import ScheduledSequence, SchedulerOutput
from jaxgen.layers.attention import AttentionMetadata


@dataclasses.dataclass
class StepInputs:
    """Numpy inputs of one step, and which scheduled sequence each logits row belongs to."""

    token_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    metadata: AttentionMetadata
    logits_indices: np.ndarray  # [S] int32: the step row each logits row is taken from
    logits_live: np.ndarray  # [2, 2] int32: [begin, end) spans of the real logits rows
    rows: list[ScheduledSequence | None]  # [S]: None for padding

    @property
    def arrays(self) -> tuple:
        """The step's array arguments, in the jitted step's order (after params and pool)."""
        return (
            self.token_ids,
            self.positions,
            self.metadata,
            self.logits_indices,
            self.logits_live,
        )


def spans(first: tuple[int, int], second: tuple[int, int]) -> np.ndarray:
    """[2, 2] int32 ``[begin, end)`` of two runs of real rows (the rest is bucket padding)."""
    return np.array([first, second], np.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepLayout:
    """Bucket sets of one engine, and the ragged layout of a batch over them."""

    page_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    min_decode_batch: int = 1  # static batching pads decode batches to its batch size
    full_width_tables: bool = True  # see the module docstring
    # Mark decode-only steps (``AttentionMetadata.decode_only``, static): for backends whose
    # decode-only attention is cheaper; such steps then compile apart from mixed ones.
    mark_decode_only: bool = False
    # Each token row carries its sequence's LoRA slot (``AttentionMetadata.lora_slots``; the
    # engine sets ``Sequence.lora_slot`` before the batch is built).
    lora: bool = False

    @property
    def token_buckets(self) -> list[int]:
        # Steps start at 2 rows: with a single row XLA CPU copied the whole donated pool each
        # step (batch-1 step time grew with pool size: 98 ms at 64 MiB, 766 ms at 512 MiB).
        return power_of_two_buckets(max(self.max_num_batched_tokens, self.max_num_seqs, 2), 2)

    @property
    def seq_cap(self) -> int:
        """Sequence slots of the largest steps: the bucket of ``max_num_seqs``."""
        return next_power_of_two(self.max_num_seqs, 2)

    def num_seq_slots(self, num_tokens: int) -> int:
        """Sequence slots (and logits rows) of a step of ``num_tokens`` rows."""
        return min(num_tokens, self.seq_cap)

    @property
    def width_buckets(self) -> list[int]:
        return power_of_two_buckets(-(-self.max_model_len // self.page_size))

    @property
    def full_width(self) -> int:
        """Block-table width (pages) that covers ``max_model_len``."""
        return self.width_buckets[-1]

    def _width(self, tokens: list[int]) -> int:
        """Block-table width for sequences of ``tokens`` tokens."""
        if self.full_width_tables:
            return self.full_width
        pages = max((-(-t // self.page_size) for t in tokens), default=1)
        return bucket_for(max(pages, 1), self.width_buckets)

    def ragged(self, out: SchedulerOutput, lookahead: int = 0) -> StepInputs:
        """The step's tokens end to end, decode sequences first. ``lookahead``: tokens each
        sequence will decode after this one within the same call (multi-step decoding), which
        its block table must cover."""
        items = [s for s in out.scheduled if s.num_new_tokens == 1]
        num_decode = len(items)
        items += [s for s in out.scheduled if s.num_new_tokens > 1]
        total = sum(item.num_new_tokens for item in items)
        floor = min(self.min_decode_batch, self.seq_cap) if num_decode else 0
        num_tokens = bucket_for(max(total, floor), self.token_buckets)
        num_seqs = self.num_seq_slots(num_tokens)
        width = self._width(
            [s.seq.num_computed_tokens + s.num_new_tokens + lookahead for s in items]
        )
        token_ids = np.zeros(num_tokens, np.int32)
        positions = np.zeros(num_tokens, np.int32)
        slots = np.full(num_tokens, SCRATCH_PAGE * self.page_size, np.int32)
        cu_q_lens = np.full(num_seqs + 1, total, np.int32)
        kv_lens = np.zeros(num_seqs, np.int32)
        long_rope = np.zeros(num_seqs, bool)
        tables = np.zeros((num_seqs, width), np.int32)
        logits_indices = np.zeros(num_seqs, np.int32)
        row = self._decode_rows(items[:num_decode], width, token_ids, positions, slots, tables)
        cu_q_lens[:num_decode] = logits_indices[:num_decode] = np.arange(num_decode)
        kv_lens[:num_decode] = positions[:num_decode] + 1
        long_rope[:num_decode] = [item.seq.long_rope for item in items[:num_decode]]
        for index, item in enumerate(items[num_decode:], num_decode):  # prefill chunks
            seq, start, count = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            end = row + count
            table = np.asarray(seq.block_table[:width], np.int32)
            pos = np.arange(start, start + count, dtype=np.int32)
            token_ids[row:end] = seq.token_ids[start : start + count]
            positions[row:end] = pos
            slots[row:end] = table[pos // self.page_size] * self.page_size + pos % self.page_size
            cu_q_lens[index] = row
            kv_lens[index] = start + count
            long_rope[index] = seq.long_rope
            tables[index, : len(table)] = table
            logits_indices[index] = end - 1
            row = end
        md = AttentionMetadata(
            slot_mapping=slots,
            cu_q_lens=cu_q_lens,
            kv_lens=kv_lens,
            block_tables=tables,
            num_seqs=np.array([len(items)], np.int32),
            live_rows=spans((0, num_decode), (num_decode, total)),
            long_rope=long_rope,
            decode_only=self.mark_decode_only and num_decode == total and num_tokens == num_seqs,
            lora_slots=self._lora_slots(items, num_tokens),
        )
        rows: list = items + [None] * (num_seqs - len(items))
        live = spans((0, num_decode), (num_decode, len(items)))
        return StepInputs(token_ids, positions, md, logits_indices, live, rows)

    def _lora_slots(self, items: list, num_tokens: int) -> np.ndarray | None:
        """[T] int32: each row's LoRA slot in the ragged order of ``items`` (-1: none, padding
        too); None when the engine serves no adapters."""
        if not self.lora:
            return None
        counts = [item.num_new_tokens for item in items]
        slots = np.full(num_tokens, -1, np.int32)
        filled = np.repeat(np.array([item.seq.lora_slot for item in items], np.int32), counts)
        slots[: len(filled)] = filled
        return slots

    def _decode_rows(self, decode: list, width: int, token_ids, positions, slots, tables) -> int:
        """Fills the decode rows (one token each, at the front) in bulk: their token, position,
        KV slot and block table. Returns the rows filled."""
        page = self.page_size
        rows = len(decode)
        if not rows:
            return 0
        tokens, starts, last_pages, row_tables = [], [], [], []
        for item in decode:
            seq = item.seq
            start = seq.num_computed_tokens
            table = seq.block_table
            prompt = seq.prompt_token_ids
            if start < len(prompt):
                tokens.append(prompt[start])
            else:
                tokens.append(seq.output_token_ids[start - len(prompt)])
            starts.append(start)
            last_pages.append(table[start // page])
            row_tables.append(table if len(table) <= width else table[:width])
        token_ids[:rows] = tokens
        positions[:rows] = starts
        slots[:rows] = np.asarray(last_pages, np.int32) * page + positions[:rows] % page
        # Every block table into its row at once: the row-major cells before each row's length.
        lengths = np.fromiter(map(len, row_tables), np.int64, rows)
        pages = np.fromiter(itertools.chain.from_iterable(row_tables), np.int32, int(lengths.sum()))
        tables[:rows][np.arange(width) < lengths[:, None]] = pages
        return rows

    def padding_step(self, num_tokens: int, width: int | None = None) -> StepInputs:
        """An all-padding step of ``num_tokens`` rows (for precompiling): it writes only the
        scratch page, attends to nothing and samples only padding rows."""
        num_seqs = self.num_seq_slots(num_tokens)
        md = AttentionMetadata(
            slot_mapping=np.full(num_tokens, SCRATCH_PAGE * self.page_size, np.int32),
            cu_q_lens=np.zeros(num_seqs + 1, np.int32),
            kv_lens=np.zeros(num_seqs, np.int32),
            block_tables=np.zeros((num_seqs, width or self.full_width), np.int32),
            num_seqs=np.zeros(1, np.int32),
            live_rows=spans((0, 0), (num_tokens, num_tokens)),
            long_rope=np.zeros(num_seqs, bool),
            decode_only=self.mark_decode_only and num_tokens == num_seqs,
            lora_slots=self._lora_slots([], num_tokens),
        )
        zeros = np.zeros(num_tokens, np.int32)
        live = spans((0, 0), (num_seqs, num_seqs))
        return StepInputs(
            zeros, zeros.copy(), md, np.zeros(num_seqs, np.int32), live, [None] * num_seqs
        )

    def precompile_shapes(self) -> list[StepInputs]:
        """One padding step per shape a batch can take: with full-width tables every token
        bucket (that is every shape); otherwise decode-only steps (token buckets up to the
        sequence cap) at every width bucket, and steps holding prefill rows compile when met.
        Where decode-only steps are marked, a padding step up to the cap is one (a mixed step
        of that shape compiles when met)."""
        if self.full_width_tables:
            return [self.padding_step(t) for t in self.token_buckets]
        return [
            self.padding_step(t, w)
            for t in self.token_buckets
            if t <= self.seq_cap
            for w in self.width_buckets
        ]
