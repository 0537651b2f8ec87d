"""The model runner: the only module that builds device arrays. One jitted step per engine step.

It lays a scheduled batch out over declared buckets (``step_layout``), runs model + sampling in
one jitted function with the KV pool donated (updated in place), and brings back the sampled
tokens in one device-to-host transfer. ``precompile`` builds the step's executables up front.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from flax import nnx

from jaxgen.backends import AttentionBackend, select_backend
from jaxgen.engine import compile_counter
from jaxgen.engine.sampler import SamplingFlags, SamplingRow, build_sampling_tensors, sample
from jaxgen.engine.sampling_tensors import min_tokens_banned_ids
from jaxgen.engine.scheduler import SchedulerOutput
from jaxgen.engine.step_layout import StepInputs, StepLayout
from jaxgen.sampling_params import SamplingParams

LOGPROB_BUCKETS = (1, 5, 20, 1 << 30)
_PADDING_ROW = SamplingRow(SamplingParams(temperature=0.0))


@functools.lru_cache(maxsize=16)
def jitted_step(graphdef, backend: AttentionBackend):
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
            hidden[logits_indices], head_kernel=head, live_rows=logits_live
        )
        return kv_cache, sample(logits, sampling, flags)

    return jax.jit(step, static_argnames=("flags",), donate_argnums=(1,))


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
        attention_backend: str | AttentionBackend = "auto",
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
        self.backend = (
            attention_backend
            if isinstance(attention_backend, AttentionBackend)
            else select_backend(attention_backend, dtype=self.dtype, kv_sharding=kv_sharding)
        )
        # The parameters the step runs on (``params`` stays as loaded) and the LM head kernel
        # to use instead of the model's (or None), both in the backend's form.
        self.step_params, self.head_kernel = self.backend.prepare_params(self.params, self.config)
        self.layout = StepLayout(
            page_size=page_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            min_decode_batch=min_decode_batch,
            full_width_tables=self.backend.full_width_tables,
        )
        self.base_seed = seed
        self.step_counter = 0
        self.kv_sharding = kv_sharding
        self.kv_cache = self._allocate_pool()
        self._step = jitted_step(self.graphdef, self.backend)

    def _allocate_pool(self):
        return self.backend.allocate_kv_pool(
            self.config, self.num_pages, self.page_size, self.dtype, self.kv_sharding
        )

    def recover(self) -> bool:
        """Makes the runner usable after a step raised. The pool was donated to that step, so
        it may be deleted: then a new one (same layout and sharding) replaces it. Returns
        whether the pool was replaced (its contents, every cached K/V, are then gone). Raises
        ``RuntimeError`` if the parameters are gone too: nothing here can bring them back."""
        if any(_deleted(leaf) for leaf in jax.tree_util.tree_leaves(self.step_params)):
            raise RuntimeError("the model parameters were deleted by a failed step")
        if not any(_deleted(leaf) for leaf in jax.tree_util.tree_leaves(self.kv_cache)):
            return False
        self.kv_cache = None  # drop the dead arrays before allocating their replacement
        self.kv_cache = self._allocate_pool()
        return True

    @property
    def kv_cache_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(self.kv_cache))

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """Numpy inputs of the step for ``out`` (its tables as wide as this backend wants)."""
        return self.layout.ragged(out)

    def _execute(self, inputs: StepInputs, sampling_rows: list[SamplingRow]):
        """Runs the jitted step (the pool is donated and replaced); returns the host result."""
        tensors, flags = build_sampling_tensors(
            sampling_rows,
            len(inputs.rows),
            base_seed=self.base_seed,
            step_counter=self.step_counter,
        )
        self.step_counter += 1
        if flags.num_logprobs:  # a few buckets, not one executable per requested k
            k = next(b for b in LOGPROB_BUCKETS if b >= flags.num_logprobs)
            flags = dataclasses.replace(flags, num_logprobs=k)
        self.kv_cache, result = self._step(
            self.step_params,
            self.kv_cache,
            *inputs.arrays,
            tensors,
            flags=flags,
            head=self.head_kernel,
        )
        return jax.device_get(result), flags  # the one device-to-host transfer of the step

    def precompile(self, sampling_params: list[SamplingParams] | None = None) -> int:
        """Compiles the step for every shape a batch can take (``StepLayout.precompile_shapes``:
        every shape with full-width tables; otherwise decode-only steps at each width bucket,
        and steps with prefill rows compile when first met). One set per sampling configuration in
        ``sampling_params`` (default: greedy). Runs each shape once on all-padding inputs, which
        touch only the scratch page. Returns the number of XLA compilations it caused."""
        before = compile_counter.compile_count()
        configs = sampling_params or [SamplingParams(temperature=0.0)]
        shapes = self.layout.precompile_shapes()
        step_counter = self.step_counter  # unseeded sampling does not depend on precompiling
        rows = []  # one real row per variant gives the flags and the banned-token width
        for params in configs:
            rows.append(SamplingRow(params))
            banned = min_tokens_banned_ids(params, 0, self.config.eos_token_ids)
            if banned:  # while min_tokens is not reached
                rows.append(SamplingRow(params, banned_token_ids=banned))
        for row in rows:
            for inputs in shapes:  # the logits rows are all padding anyway
                self._execute(inputs, [row] + [_PADDING_ROW] * (len(inputs.rows) - 1))
        self.step_counter = step_counter
        return compile_counter.compile_count() - before

    def run(self, out: SchedulerOutput, sampling_row_for) -> StepResult:
        """Runs one step; ``sampling_row_for(seq)`` gives a sequence's ``SamplingRow``."""
        inputs = self.prepare(out)
        rows = inputs.rows
        sampling_rows = [
            sampling_row_for(item.seq) if item is not None and item.completes else _PADDING_ROW
            for item in rows
        ]
        result, flags = self._execute(inputs, sampling_rows)
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


def _deleted(leaf) -> bool:
    is_deleted = getattr(leaf, "is_deleted", None)
    return bool(is_deleted()) if is_deleted is not None else False


__all__ = ["ModelRunner", "StepResult", "SamplingFlags", "SamplingRow"]
