"""How a scheduled batch becomes the padded numpy inputs of one jitted step.

Two layouts, both padded to declared buckets so a steady workload compiles nothing new:

- ``token_rows`` (the native CPU attention backend): every token of the step is one row of the
  paged attention kernel, a decode token and a prefill token alike (a prefill token at position
  ``p`` attends to ``p + 1`` keys, so the causal mask is the row's length). The kernel reads
  each row only up to its length, so block tables are full width at no cost, and the step's
  shape is its token bucket alone: ``len(token_buckets)`` executables cover every batch, which
  :meth:`ModelRunner.precompile` builds up front.
- ``split`` (the XLA reference and Pallas backends): decode rows, then prefill rows laid out
  for the blocked XLA prefill attention and the ragged Pallas kernel. Decode rows, prefill
  tokens, query blocks, prefill sequences and table widths are bucketed separately.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgen.attention import AttentionMetadata
from jaxgen.engine.buckets import bucket_for, power_of_two_buckets
from jaxgen.engine.page_allocator import SCRATCH_PAGE
from jaxgen.engine.scheduler import ScheduledSequence, SchedulerOutput

QUERY_BLOCK = 16  # query rows per prefill attention block (XLA path)


@dataclasses.dataclass
class StepInputs:
    """Numpy inputs of one step, and which scheduled sequence each logits row belongs to."""

    token_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    metadata: AttentionMetadata
    logits_indices: np.ndarray  # [N] int32: the step row each logits row is taken from
    logits_live: np.ndarray  # [2, 2] int32: [begin, end) spans of the real logits rows
    rows: list[ScheduledSequence | None]  # [N]: None for padding


def spans(first: tuple[int, int], second: tuple[int, int]) -> np.ndarray:
    """[2, 2] int32 ``[begin, end)`` of two runs of real rows (the rest is bucket padding)."""
    return np.array([first, second], np.int32)


def _empty_prefill(width: int = 1) -> dict:
    """Prefill metadata with no prefill rows."""
    return dict(
        prefill_query_index=np.zeros((0, QUERY_BLOCK), np.int32),
        prefill_query_positions=np.zeros((0, QUERY_BLOCK), np.int32),
        prefill_block_tables=np.zeros((0, width), np.int32),
        prefill_cu_q_lens=np.zeros(1, np.int32),
        prefill_kv_lens=np.zeros(0, np.int32),
        prefill_seq_block_tables=np.zeros((0, width), np.int32),
        prefill_num_seqs=np.zeros(1, np.int32),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepLayout:
    """Bucket sets of one engine, and the two ways of laying a batch out over them."""

    page_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    min_decode_batch: int = 1  # static batching pads decode batches to its batch size

    @property
    def decode_buckets(self) -> list[int]:
        # Batches start at 2 rows: with a single row XLA CPU copied the whole donated pool each
        # step (batch-1 step time grew with pool size: 98 ms at 64 MiB, 766 ms at 512 MiB).
        return power_of_two_buckets(max(self.max_num_seqs, 2), start=2)

    @property
    def prefill_token_buckets(self) -> list[int]:
        return power_of_two_buckets(self.max_num_batched_tokens, start=16)

    @property
    def token_buckets(self) -> list[int]:
        """Step sizes of the ``token_rows`` layout (decode and prefill tokens together)."""
        return power_of_two_buckets(max(self.max_num_batched_tokens, self.max_num_seqs, 2), 2)

    @property
    def width_buckets(self) -> list[int]:
        return power_of_two_buckets(-(-self.max_model_len // self.page_size))

    @property
    def full_width(self) -> int:
        """Block-table width (pages) that covers ``max_model_len``."""
        return self.width_buckets[-1]

    def logits_rows(self, num_tokens: int) -> int:
        """Logits rows of a ``token_rows`` step: a function of its token bucket alone."""
        return min(num_tokens, self.decode_buckets[-1])

    def _width(self, tokens: list[int]) -> int:
        """Block-table width bucket (in pages) covering the longest of ``tokens``."""
        pages = max((-(-t // self.page_size) for t in tokens), default=1)
        return bucket_for(max(pages, 1), self.width_buckets)

    # -- token_rows ---------------------------------------------------------------------------
    def token_rows(self, out: SchedulerOutput) -> StepInputs:
        """Every token one attention row; the step's only shape is its token bucket."""
        items = list(out.scheduled)
        total = sum(item.num_new_tokens for item in items)
        has_decode = any(item.num_new_tokens == 1 for item in items)
        floor = min(self.min_decode_batch, self.decode_buckets[-1]) if has_decode else 0
        num_tokens = bucket_for(max(total, floor), self.token_buckets)
        width = self.full_width
        token_ids = np.zeros(num_tokens, np.int32)
        positions = np.zeros(num_tokens, np.int32)
        slots = np.full(num_tokens, SCRATCH_PAGE * self.page_size, np.int32)
        lengths = np.zeros(num_tokens, np.int32)
        tables = np.zeros((num_tokens, width), np.int32)
        num_logits = self.logits_rows(num_tokens)
        logits_indices = np.zeros(num_logits, np.int32)
        row = 0
        for index, item in enumerate(items):
            seq, start, count = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            end = row + count
            table = np.asarray(seq.block_table[:width], np.int32)
            pos = np.arange(start, start + count, dtype=np.int32)
            if count == 1:
                token_ids[row] = seq.token_at(start)
            else:
                token_ids[row:end] = seq.token_ids[start : start + count]
            positions[row:end] = pos
            slots[row:end] = table[pos // self.page_size] * self.page_size + pos % self.page_size
            lengths[row:end] = pos + 1
            tables[row:end, : len(table)] = table
            logits_indices[index] = end - 1
            row = end
        md = AttentionMetadata(
            slot_mapping=slots,
            decode_lengths=lengths,
            decode_block_tables=tables,
            live_rows=spans((0, total), (num_tokens, num_tokens)),
            **_empty_prefill(),
        )
        rows: list = items + [None] * (num_logits - len(items))
        live = spans((0, len(items)), (num_logits, num_logits))
        return StepInputs(token_ids, positions, md, logits_indices, live, rows)

    def token_rows_dummy(self, num_tokens: int) -> StepInputs:
        """An all-padding ``token_rows`` step of ``num_tokens`` rows (for precompiling): it
        writes only the scratch page, attends to nothing and samples only padding rows."""
        return self._padding_step(num_tokens, self.full_width, self.logits_rows(num_tokens))

    # -- split ----------------------------------------------------------------------------------
    def split(self, out: SchedulerOutput) -> StepInputs:
        """Decode rows (one per sequence), then prefill rows in blocked and ragged views."""
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        num_decode = bucket_for(len(decodes), self.decode_buckets) if decodes else 0
        if decodes:
            num_decode = max(num_decode, min(self.min_decode_batch, self.decode_buckets[-1]))
        prefill_tokens = sum(s.num_new_tokens for s in prefills)
        num_prefill = bucket_for(prefill_tokens, self.prefill_token_buckets) if prefills else 0
        total = num_decode + num_prefill
        token_ids = np.zeros(total, np.int32)
        positions = np.zeros(total, np.int32)
        slots = np.full(total, SCRATCH_PAGE * self.page_size, np.int32)

        def fill(row: int, seq, pos: int) -> None:
            token_ids[row] = seq.token_at(pos)
            positions[row] = pos
            slots[row] = (
                seq.block_table[pos // self.page_size] * self.page_size + pos % self.page_size
            )

        # Decode section: the XLA reference gathers the whole table width, so the width buckets.
        if not decodes:
            width_d = 1
        else:
            width_d = self._width([s.seq.num_computed_tokens + 1 for s in decodes])
        dec_lengths = np.zeros(num_decode, np.int32)
        dec_tables = np.zeros((num_decode, width_d), np.int32)
        for i, item in enumerate(decodes):
            seq = item.seq
            fill(i, seq, seq.num_computed_tokens)
            dec_lengths[i] = seq.num_computed_tokens + 1
            table = seq.block_table[:width_d]
            dec_tables[i, : len(table)] = table

        # Prefill section: flat rows, blocked view (XLA path) and ragged view (Pallas path).
        ends = [s.seq.num_computed_tokens + s.num_new_tokens for s in prefills]
        width_p = self._width(ends) if prefills else 1
        num_blocks = sum(-(-s.num_new_tokens // QUERY_BLOCK) for s in prefills)
        block_buckets = power_of_two_buckets(max(num_blocks, 2), start=2)
        nb = bucket_for(num_blocks, block_buckets) if prefills else 0
        seq_buckets = power_of_two_buckets(max(len(prefills), 2), start=2)
        sp = bucket_for(len(prefills), seq_buckets) if prefills else 0
        q_index = np.full((nb, QUERY_BLOCK), num_prefill, np.int32)
        q_pos = np.full((nb, QUERY_BLOCK), -1, np.int32)
        q_tables = np.zeros((nb, width_p), np.int32)
        cu_q = np.zeros(sp + 1, np.int32)
        kv_lens = np.zeros(sp, np.int32)
        seq_tables = np.zeros((sp, width_p), np.int32)
        row = 0
        block = 0
        for j, item in enumerate(prefills):
            seq, start = item.seq, item.seq.num_computed_tokens
            table = seq.block_table[:width_p]
            for k in range(item.num_new_tokens):
                fill(num_decode + row + k, seq, start + k)
            for b in range(0, item.num_new_tokens, QUERY_BLOCK):
                n = min(QUERY_BLOCK, item.num_new_tokens - b)
                q_index[block, :n] = np.arange(row + b, row + b + n)
                q_pos[block, :n] = np.arange(start + b, start + b + n)
                q_tables[block, : len(table)] = table
                block += 1
            row += item.num_new_tokens
            cu_q[j + 1] = row
            kv_lens[j] = start + item.num_new_tokens
            seq_tables[j, : len(table)] = table
        cu_q[len(prefills) + 1 :] = row

        md = AttentionMetadata(
            slot_mapping=slots,
            decode_lengths=dec_lengths,
            decode_block_tables=dec_tables,
            prefill_query_index=q_index,
            prefill_query_positions=q_pos,
            prefill_block_tables=q_tables,
            prefill_cu_q_lens=cu_q,
            prefill_kv_lens=kv_lens,
            prefill_seq_block_tables=seq_tables,
            prefill_num_seqs=np.array([len(prefills)], np.int32),
            live_rows=spans((0, len(decodes)), (num_decode, num_decode + prefill_tokens)),
        )
        # Logits rows: decode rows, then the last row of each prefill chunk.
        rows: list = [item for item in decodes] + [None] * (num_decode - len(decodes))
        logits_indices = list(range(num_decode))
        row = 0
        for item in prefills:
            row += item.num_new_tokens
            logits_indices.append(num_decode + row - 1)
            rows.append(item)
        logits_indices += [0] * (sp - len(prefills))
        rows += [None] * (sp - len(prefills))
        live = spans((0, len(decodes)), (num_decode, num_decode + len(prefills)))
        return StepInputs(token_ids, positions, md, np.array(logits_indices, np.int32), live, rows)

    def split_decode_dummy(self, num_decode: int, width: int) -> StepInputs:
        """An all-padding decode-only ``split`` step (for precompiling)."""
        return self._padding_step(num_decode, width, num_decode)

    def _padding_step(self, num_rows: int, width: int, num_logits: int) -> StepInputs:
        """``num_rows`` padding rows (scratch-page writes, length 0) and ``num_logits`` padding
        logits rows: a step of that shape that changes nothing."""
        md = AttentionMetadata(
            slot_mapping=np.full(num_rows, SCRATCH_PAGE * self.page_size, np.int32),
            decode_lengths=np.zeros(num_rows, np.int32),
            decode_block_tables=np.zeros((num_rows, width), np.int32),
            live_rows=spans((0, 0), (num_rows, num_rows)),
            **_empty_prefill(),
        )
        zeros = np.zeros(num_rows, np.int32)
        live = spans((0, 0), (num_logits, num_logits))
        return StepInputs(
            zeros, zeros.copy(), md, np.zeros(num_logits, np.int32), live, [None] * num_logits
        )
