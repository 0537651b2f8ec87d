"""The model runner: the only module that builds device arrays. One jitted step per engine step.

It lays a scheduled batch out as decode rows then prefill rows, pads every array to a declared
bucket, runs model + sampling in one jitted function with the KV pool donated (updated in place),
and brings back the sampled tokens in one device-to-host transfer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.attention import AttentionMetadata, resolve_backend
from jaxgen.engine import compile_counter
from jaxgen.engine.buckets import bucket_for, power_of_two_buckets
from jaxgen.engine.page_allocator import SCRATCH_PAGE
from jaxgen.engine.sampler import SamplingFlags, SamplingRow, build_sampling_tensors, sample
from jaxgen.engine.scheduler import SchedulerOutput
from jaxgen.engine.sequence import Sequence
from jaxgen.models.linear import pack_linear_weights
from jaxgen.sampling_params import SamplingParams
from pallas_kernels.matmul_cpu import matmul_kernel_available, pack_weight

QUERY_BLOCK = 16  # query rows per prefill attention block (XLA path)
LOGPROB_BUCKETS = (1, 5, 20, 1 << 30)
_PADDING_ROW = SamplingRow(SamplingParams(temperature=0.0))


@functools.lru_cache(maxsize=16)
def jitted_step(graphdef, backend: str):
    """The engine step, jitted once per model graph and backend: engines over the same model
    share compiled executables. The KV pool (argument 1) is donated so its updates are in place."""

    def step(
        params,
        kv_cache,
        token_ids,
        positions,
        md,
        logits_indices,
        logits_live,
        sampling,
        flags,
        head,
    ):
        model = nnx.merge(graphdef, params)
        hidden, kv_cache = model(token_ids, positions, kv_cache, md, backend=backend)
        # [N, V]: only the rows that sample
        logits = model.compute_logits(
            hidden[logits_indices], packed_lm_head=head, live_rows=logits_live
        )
        return kv_cache, sample(logits, sampling, flags)

    return jax.jit(step, static_argnames=("flags",), donate_argnums=(1,))


def _spans(num_decodes: int, decode_rows: int, num_prefill_rows: int) -> np.ndarray:
    """[2, 2] [begin, end) of the real rows of a [decode section | prefill section] layout."""
    return np.array([[0, num_decodes], [decode_rows, decode_rows + num_prefill_rows]], np.int32)


@dataclasses.dataclass
class StepResult:
    """Host-side results of one step, for the sequences whose step completed them."""

    token_ids: dict[int, int]  # seq_id -> sampled token
    logprobs: dict[int, dict[int, float]]  # seq_id -> {token: logprob} (when requested)


class ModelRunner:
    """Owns the parameters, the KV pool and the jitted step."""

    def __init__(
        self,
        loaded,
        *,
        num_pages: int,
        page_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        attention_backend: str = "auto",
        min_decode_batch: int = 1,
        kv_sharding=None,
        seed: int = 0,
    ):
        compile_counter.install()
        self.config = loaded.config
        self.graphdef = loaded.graphdef
        self.params = loaded.params
        self.dtype = loaded.dtype
        self.page_size = page_size
        self.num_pages = num_pages
        self.max_model_len = max_model_len
        self.backend = resolve_backend(
            attention_backend,
            dtype=self.dtype,
            sharded=kv_sharding is not None and len(kv_sharding.device_set) > 1,
        )
        # The "cpu" backend also runs the projections on the native matmul: the step gets a copy
        # of the parameters with the Linear kernels panel-packed (``params`` stays unpacked).
        use_matmul_kernel = self.backend == "cpu" and matmul_kernel_available()
        self.step_params = pack_linear_weights(self.params) if use_matmul_kernel else self.params
        self.packed_lm_head = None  # a tied embedding, transposed and packed, as the LM head
        if use_matmul_kernel and self.config.tie_word_embeddings:
            self.packed_lm_head = pack_weight(self.params["embed_tokens"]["embedding"][...].T)
        # Batches start at 2 rows: with a single decode row XLA CPU copied the whole donated pool
        # each step (batch-1 step time grew with pool size: 98 ms at 64 MiB, 766 ms at 512 MiB).
        self.decode_buckets = power_of_two_buckets(max(max_num_seqs, 2), start=2)
        self.token_buckets = power_of_two_buckets(max_num_batched_tokens, start=16)
        self.width_buckets = power_of_two_buckets(-(-max_model_len // page_size))
        self.min_decode_batch = min_decode_batch
        self.base_seed = seed
        self.step_counter = 0
        cfg = self.config
        shape = (cfg.num_kv_heads, num_pages, page_size, cfg.head_dim)
        make = functools.partial(jnp.zeros, shape, self.dtype)
        if kv_sharding is not None:
            make = jax.jit(make, out_shardings=kv_sharding)
        self.kv_cache = [(make(), make()) for _ in range(cfg.num_layers)]
        self._step = jitted_step(self.graphdef, self.backend)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv_cache)

    # -- host-side layout ----------------------------------------------------------------------
    def _width(self, tokens: list[int]) -> int:
        """Block-table width bucket (in pages) covering the longest of ``tokens``."""
        pages = max((-(-t // self.page_size) for t in tokens), default=1)
        return bucket_for(max(pages, 1), self.width_buckets)

    def prepare(self, out: SchedulerOutput):
        """Numpy inputs for a step; also returns the logits row -> sequence list."""
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        num_decode = bucket_for(len(decodes), self.decode_buckets) if decodes else 0
        if decodes:
            num_decode = max(num_decode, min(self.min_decode_batch, self.decode_buckets[-1]))
        prefill_tokens = sum(s.num_new_tokens for s in prefills)
        num_prefill = bucket_for(prefill_tokens, self.token_buckets) if prefills else 0
        total = num_decode + num_prefill
        token_ids = np.zeros(total, np.int32)
        positions = np.zeros(total, np.int32)
        slots = np.full(total, SCRATCH_PAGE * self.page_size, np.int32)

        def fill(row: int, seq: Sequence, pos: int) -> None:
            token_ids[row] = seq.token_at(pos)
            positions[row] = pos
            slots[row] = (
                seq.block_table[pos // self.page_size] * self.page_size + pos % self.page_size
            )

        # Decode section. The CPU decode kernel reads only up to each row's length, so there a
        # full-width table costs nothing and takes one shape dimension out of the step (fewer
        # compiles as the load changes); the XLA reference gathers the whole width, so it buckets.
        if not decodes:
            width_d = 1
        elif self.backend == "cpu":
            width_d = self.width_buckets[-1]
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
            live_rows=_spans(len(decodes), num_decode, prefill_tokens),
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
        logits_live = _spans(len(decodes), num_decode, len(prefills))
        return token_ids, positions, md, np.array(logits_indices, np.int32), logits_live, rows

    def run(self, out: SchedulerOutput, sampling_row_for) -> StepResult:
        """Runs one step; ``sampling_row_for(seq)`` gives a sequence's ``SamplingRow``."""
        token_ids, positions, md, logits_indices, logits_live, rows = self.prepare(out)
        sampling_rows = [
            sampling_row_for(item.seq) if item is not None and item.completes else _PADDING_ROW
            for item in rows
        ]
        tensors, flags = build_sampling_tensors(
            sampling_rows, len(rows), base_seed=self.base_seed, step_counter=self.step_counter
        )
        self.step_counter += 1
        if flags.num_logprobs:  # a few buckets, not one executable per requested k
            k = next(b for b in LOGPROB_BUCKETS if b >= flags.num_logprobs)
            flags = dataclasses.replace(flags, num_logprobs=k)
        self.kv_cache, result = self._step(
            self.step_params,
            self.kv_cache,
            token_ids,
            positions,
            md,
            logits_indices,
            logits_live,
            tensors,
            flags=flags,
            head=self.packed_lm_head,
        )
        result = jax.device_get(result)  # the one device-to-host transfer of the step
        tokens, logprobs = {}, {}
        for i, item in enumerate(rows):
            if item is None or not item.completes:
                continue
            seq_id = item.seq.seq_id
            tokens[seq_id] = int(result.token_ids[i])
            if flags.num_logprobs or (
                item.seq.params is not None and item.seq.params.logprobs is not None
            ):
                entry = {int(result.token_ids[i]): float(result.logprobs[i])}
                k = item.seq.params.logprobs or 0
                for t, lp in zip(
                    result.top_token_ids[i][:k], result.top_logprobs[i][:k], strict=True
                ):
                    entry.setdefault(int(t), float(lp))
                logprobs[seq_id] = entry
        return StepResult(tokens, logprobs)


__all__ = ["ModelRunner", "StepResult", "SamplingFlags", "SamplingRow"]
