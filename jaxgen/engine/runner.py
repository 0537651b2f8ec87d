"""The model runner: owns the parameters, the KV pool and the jitted step, and executes arrays.

It takes a step's host arrays (built by the engine: ``step_batch``), runs model + sampling in one
jitted function with the KV pool donated (updated in place), and returns the sampler's arrays in
one device-to-host transfer. It knows nothing of sequences or requests.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.backends import AttentionBackend, select_backend
from jaxgen.engine import compile_counter
from jaxgen.engine.prompt_logprobs import PromptLogprobsOutput, prompt_logprobs
from jaxgen.engine.sampler import sample
from jaxgen.engine.sampling_tensors import SamplerOutput, SamplingFlags


@dataclasses.dataclass(frozen=True)
class FlatParams:
    """How the step's parameters and LM head kernel come as a flat list of distinct arrays:
    ``treedef`` of ``(params, head)``, and for each of its leaves the position of its array in
    the list. An array used by several kernels (a backend's shared buffer) is passed once, so a
    step's dispatch handles each buffer once: on CPU each argument costs microseconds, and a
    model of 700 leaves spent ~2 ms a step on it. A static argument: equal layouts share a
    compiled step, and the hash is computed once."""

    treedef: jax.tree_util.PyTreeDef
    positions: tuple[int, ...]
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.treedef, self.positions)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def flatten(cls, params, head) -> tuple[list, FlatParams]:
        """The distinct arrays of ``(params, head)``, in order of first use, and their layout."""
        leaves, treedef = jax.tree_util.tree_flatten((params, head))
        distinct, index, positions = [], {}, []
        for leaf in leaves:
            if id(leaf) not in index:
                index[id(leaf)] = len(distinct)
                distinct.append(leaf)
            positions.append(index[id(leaf)])
        return distinct, cls(treedef, tuple(positions))

    def unflatten(self, distinct: list) -> tuple:
        """``(params, head)`` from the distinct arrays."""
        return jax.tree_util.tree_unflatten(self.treedef, [distinct[i] for i in self.positions])


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
        prompt_targets=None,
        prompt_top=None,
        flat_params=None,
        from_previous=None,
        previous_tokens=None,
        feed_width=None,
        num_steps=None,
        page_size=None,
    ):
        if flat_params is not None:  # params and head came as their distinct arrays
            params, head = flat_params.unflatten(params)

        def forward(kv_cache, token_ids, positions, md, sampling):
            """The model over the step's tokens, then the sampler over its logits rows."""
            model = nnx.merge(graphdef, params)
            hidden, kv_cache = model(token_ids, positions, kv_cache, md, backend=backend)
            # [N, V]: only the rows that sample
            logits = model.compute_logits(
                hidden[logits_indices], head_kernel=head, live_rows=logits_live
            )
            return model, hidden, kv_cache, sample(logits, sampling, flags)

        if num_steps is not None:
            return decode_steps(
                lambda *carry: forward(*carry)[2:],
                (kv_cache, token_ids, positions, md, sampling),
                num_steps=num_steps,
                page_size=page_size,
            )
        if feed_width is not None:  # rows whose token the previous step sampled take it here
            taken = previous_tokens[jnp.maximum(from_previous, 0)]  # [T]
            token_ids = jnp.where(from_previous >= 0, taken, token_ids)
        model, hidden, kv_cache, sampled = forward(kv_cache, token_ids, positions, md, sampling)
        result = sampled
        if prompt_top is not None:
            # A step holding a prompt-logprobs request: the LM head on every token row too.
            all_logits = model.compute_logits(hidden, head_kernel=head, live_rows=md.live_rows)
            result = (sampled, prompt_logprobs(all_logits, prompt_targets, prompt_top))
        if feed_width is None:
            return kv_cache, result
        # [feed_width]: the sampled tokens by logits row, for the next step (one shape).
        feed = (
            jnp.zeros(feed_width, jnp.int32).at[: sampled.token_ids.shape[0]].set(sampled.token_ids)
        )
        return kv_cache, result, feed

    return jax.jit(
        step,
        static_argnames=(
            "flags",
            "prompt_top",
            "flat_params",
            "feed_width",
            "num_steps",
            "page_size",
        ),
        donate_argnums=(1,),
        compiler_options=backend.compiler_options,
    )


def decode_steps(decode_once, carry, *, num_steps: int, page_size: int):
    """``num_steps`` decode steps in one call (multi-step decoding): ``decode_once`` maps
    ``carry``, the first step's ``(kv_cache, token_ids, positions, md, sampling)``, to the
    pool and the sampler's output. The first step is decode-only: row r < num_seqs
    decodes sequence r and samples logits row r. Each step feeds the tokens it samples to the
    next, one position further (slots from the block tables, which cover them). Returns the
    pool and the sampler's outputs stacked ``[num_steps, S, ...]``."""

    def one_step(carry, _):
        kv_cache, token_ids, positions, md, sampling = carry
        kv_cache, sampled = decode_once(kv_cache, token_ids, positions, md, sampling)
        rows = jnp.arange(token_ids.shape[0], dtype=jnp.int32)
        live = rows < md.num_seqs[0]  # [T]
        positions = jnp.where(live, positions + 1, positions)
        pages = md.block_tables[rows, positions // page_size]
        md = dataclasses.replace(
            md,
            slot_mapping=jnp.where(
                live, pages * page_size + positions % page_size, md.slot_mapping
            ),
            kv_lens=jnp.where(live, md.kv_lens + 1, md.kv_lens),
        )
        token_ids = jnp.where(live, sampled.token_ids, token_ids)
        sampling = dataclasses.replace(sampling, steps=sampling.steps + 1)
        return (kv_cache, token_ids, positions, md, sampling), sampled

    (kv_cache, *_), sampled = jax.lax.scan(one_step, carry, length=num_steps)
    return kv_cache, sampled


class ModelRunner:
    """Owns the parameters, the KV pool and the jitted step."""

    def __init__(
        self,
        loaded,
        *,
        num_pages: int,
        page_size: int,
        attention_backend: str | AttentionBackend = "auto",
        kv_sharding=None,
    ):
        compile_counter.install()
        self.config = loaded.config
        self.graphdef = loaded.graphdef
        self.params = loaded.params
        self.dtype = loaded.dtype
        self.page_size = page_size
        self.num_pages = num_pages
        self.backend = (
            attention_backend
            if isinstance(attention_backend, AttentionBackend)
            else select_backend(attention_backend, dtype=self.dtype, kv_sharding=kv_sharding)
        )
        # The parameters the step runs on (``params`` stays as loaded) and the LM head kernel
        # to use instead of the model's (or None), both in the backend's form.
        self.step_params, self.head_kernel = self.backend.prepare_params(self.params, self.config)
        # The step takes the parameters and head as a flat list of distinct arrays with their
        # (static) layout: flattening the nnx state's Variables in Python on every call cost
        # ~0.4 ms a step, and each argument costs dispatch time (``FlatParams``).
        self._param_arrays, self._flat_params = FlatParams.flatten(
            self.step_params, self.head_kernel
        )
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

    def execute(
        self,
        arrays: tuple,
        flags: SamplingFlags,
        prompt_targets=None,
        prompt_top: int | None = None,
    ) -> tuple[SamplerOutput, PromptLogprobsOutput | None]:
        """Runs one step on ``arrays`` (``StepBatch.arrays``: the step's inputs, then the
        sampling tensors) with static ``flags``; the pool is donated and replaced. With
        ``prompt_top`` (static; None: off) it also returns each token row's logprob of its
        ``prompt_targets`` [T] and the top ``prompt_top``. Returns the sampler's output (and
        the prompt logprobs, or None) as numpy arrays: the one device-to-host transfer."""
        return self.fetch(self.dispatch(arrays, flags, prompt_targets, prompt_top))

    def dispatch(
        self,
        arrays: tuple,
        flags: SamplingFlags,
        prompt_targets=None,
        prompt_top: int | None = None,
        from_previous=None,
        previous_tokens=None,
        num_steps: int = 1,
    ) -> InFlight:
        """Starts the step of ``execute`` without waiting for it; ``fetch`` waits. With
        ``previous_tokens`` (asynchronous scheduling: the feed of the step before, on the
        device) the rows where ``from_previous`` [T] is >= 0 take their token from it, and the
        step returns its own feed. ``num_steps`` > 1 (a decode-only step whose block tables
        cover that many tokens more): that many decode steps, each fed the last one's tokens;
        the sampler's output is stacked ``[num_steps, S, ...]``."""
        extra = {}
        if prompt_top is not None:
            extra = {"prompt_targets": prompt_targets, "prompt_top": prompt_top}
        if num_steps > 1:
            extra |= {"num_steps": num_steps, "page_size": self.page_size}
        if previous_tokens is not None:
            extra |= {
                "from_previous": from_previous,
                "previous_tokens": previous_tokens,
                "feed_width": previous_tokens.shape[0],
            }
        self.kv_cache, *result = self._step(
            self._param_arrays,
            self.kv_cache,
            *arrays,
            flags=flags,
            head=None,
            flat_params=self._flat_params,
            **extra,
        )
        feed = result[1] if previous_tokens is not None else None
        return InFlight(result[0], feed, prompt_top is not None)

    def fetch(self, step: InFlight) -> tuple[SamplerOutput, PromptLogprobsOutput | None]:
        """The result of a dispatched step, as ``execute`` returns it (waits for the step)."""
        result = jax.device_get(step.result)
        return result if step.has_prompt_logprobs else (result, None)


@dataclasses.dataclass
class InFlight:
    """A dispatched step: its device result and the feed of its sampled tokens."""

    result: object
    feed: jax.Array | None  # [feed_width] int32: the tokens it sampled (async scheduling)
    has_prompt_logprobs: bool


def _deleted(leaf) -> bool:
    is_deleted = getattr(leaf, "is_deleted", None)
    return bool(is_deleted()) if is_deleted is not None else False
