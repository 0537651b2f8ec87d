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
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.backends import AttentionBackend, select_backend
from jaxgen.engine import compile_counter
from jaxgen.engine.prompt_logprobs import PROMPT_TOP, PromptLogprobsOutput, prompt_logprobs
from jaxgen.engine.sampler import sample
from jaxgen.engine.sampling_shapes import GENERAL_FLAGS, SamplingShapes
from jaxgen.engine.sampling_tensors import SamplerOutput


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
    share compiled executables. The KV pool (argument 1) is donated so its updates are in place.

    A step runs the model and returns its logits rows (padded to ``sample_rows``, the sampler's
    row bucket) and every token row's prompt logprobs, computed only when a row has a target
    (``prompt_targets`` >= 0): its executable depends on the step's shape alone, and the
    sampler (``jitted_sampler``) is one executable per row bucket for every sampling
    configuration. A multi-step call (``num_steps``) samples inside its decode loop."""

    def step(
        params,
        kv_cache,
        token_ids,
        positions,
        md,
        logits_indices,
        logits_live,
        prompt_targets,
        head,
        sample_rows=None,
        flat_params=None,
        from_previous=None,
        previous_tokens=None,
        num_steps=None,
        page_size=None,
        sampling=None,
    ):
        if flat_params is not None:  # params and head came as their distinct arrays
            params, head = flat_params.unflatten(params)

        def forward(kv_cache, token_ids, positions, md):
            """The model over the step's tokens; its logits rows padded to ``sample_rows``."""
            model = nnx.merge(graphdef, params)
            hidden, kv_cache = model(token_ids, positions, kv_cache, md, backend=backend)
            # [N, V]: only the rows that sample
            logits = model.compute_logits(
                hidden[logits_indices], head_kernel=head, live_rows=logits_live
            )
            logits = jnp.pad(logits, ((0, sample_rows - logits.shape[0]), (0, 0)))
            return model, hidden, kv_cache, logits

        if num_steps is not None:

            def decode_once(kv_cache, token_ids, positions, md, sampling):
                _, _, kv_cache, logits = forward(kv_cache, token_ids, positions, md)
                return kv_cache, sample(logits, sampling, GENERAL_FLAGS)

            return decode_steps(
                decode_once,
                (kv_cache, token_ids, positions, md, sampling),
                num_steps=num_steps,
                page_size=page_size,
            )
        if from_previous is not None:  # rows whose token the previous step sampled take it here
            taken = previous_tokens[jnp.maximum(from_previous, 0)]  # [T]
            token_ids = jnp.where(from_previous >= 0, taken, token_ids)
        model, hidden, kv_cache, logits = forward(kv_cache, token_ids, positions, md)

        def with_prompt_logprobs():
            # The LM head on every token row too (a step holding a prompt-logprobs request).
            all_logits = model.compute_logits(hidden, head_kernel=head, live_rows=md.live_rows)
            return prompt_logprobs(all_logits, prompt_targets, PROMPT_TOP)

        def without():
            rows = prompt_targets.shape[0]
            return PromptLogprobsOutput(
                jnp.zeros(rows, jnp.float32),
                jnp.zeros((rows, PROMPT_TOP), jnp.int32),
                jnp.zeros((rows, PROMPT_TOP), jnp.float32),
            )

        prompt = jax.lax.cond(jnp.any(prompt_targets >= 0), with_prompt_logprobs, without)
        return kv_cache, (logits, prompt)

    return jax.jit(
        step,
        static_argnames=("sample_rows", "flat_params", "num_steps", "page_size"),
        donate_argnums=(1,),
        compiler_options=backend.compiler_options,
    )


@functools.lru_cache(maxsize=16)
def jitted_sampler(feed_width: int):
    """The sampler of every step: ``(logits [R, V], sampling [R]) -> (SamplerOutput, feed)``
    with every stage on (``GENERAL_FLAGS``; a stage no row needs is skipped at run time), so
    one executable per row bucket serves every sampling configuration. ``feed``
    [feed_width] holds the sampled tokens by row, for the next step (asynchronous
    scheduling)."""

    def run(logits, sampling):
        sampled = sample(logits, sampling, GENERAL_FLAGS)
        feed = jnp.zeros(feed_width, jnp.int32).at[: sampled.token_ids.shape[0]]
        return sampled, feed.set(sampled.token_ids)

    return jax.jit(run)


def decode_steps(decode_once, carry, *, num_steps: int, page_size: int):
    """``num_steps`` decode steps in one call (multi-step decoding): ``decode_once`` maps
    ``carry``, the first step's ``(kv_cache, token_ids, positions, md, sampling)``, to the
    pool and the sampler's output (its rows padded past the step's). The first step is
    decode-only: row r < num_seqs decodes sequence r and samples logits row r. Each step feeds the tokens it samples to the
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
        token_ids = jnp.where(live, sampled.token_ids[: token_ids.shape[0]], token_ids)
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
        max_model_len: int,
        seq_cap: int,
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
        self.sampling_shapes = SamplingShapes(
            vocab_size=self.config.vocab_size,
            max_model_len=max_model_len,
            seq_cap=seq_cap,
            place=self._place,
        )
        self._sample = jitted_sampler(seq_cap)
        self._empty_targets: dict[int, jax.Array] = {}

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

    def execute(self, arrays: tuple, prompt_targets=None):
        """Runs one step on ``arrays`` (``StepBatch.arrays``: the step's inputs, then the
        sampling tensors, numpy) and waits for it. With ``prompt_targets`` [T] (the next
        prompt token of each row, -1 for none) it also returns the prompt logprobs. Returns
        the sampler's output (and the prompt logprobs, or None) as numpy arrays: the one
        device-to-host transfer."""
        return self.fetch(self.dispatch(arrays, prompt_targets))

    def dispatch(
        self,
        arrays: tuple,
        prompt_targets=None,
        from_previous=None,
        previous_tokens=None,
        num_steps: int = 1,
    ) -> InFlight:
        """Starts the step of ``execute`` without waiting for it; ``fetch`` waits. With
        ``previous_tokens`` (asynchronous scheduling: the feed of the step before, on the
        device) the rows where ``from_previous`` [T] is >= 0 take their token from it.
        ``num_steps`` > 1 (a decode-only step whose block tables cover that many tokens
        more): that many decode steps, each fed the last one's tokens; the sampler's output
        is stacked ``[num_steps, R, ...]``."""
        *inputs, sampling = arrays
        sampling = self.sampling_shapes.fit(sampling)
        sample_rows = sampling.temperature.shape[0]
        wants_prompt = prompt_targets is not None
        if not wants_prompt:
            prompt_targets = self._no_targets(inputs[0].shape[0])
        extra = {}
        if num_steps > 1:
            extra = {"num_steps": num_steps, "page_size": self.page_size, "sampling": sampling}
        if previous_tokens is not None:
            extra |= {"from_previous": from_previous, "previous_tokens": previous_tokens}
        self.kv_cache, result = self._step(
            self._param_arrays,
            self.kv_cache,
            *inputs,
            prompt_targets,
            head=None,
            sample_rows=sample_rows,
            flat_params=self._flat_params,
            **extra,
        )
        if num_steps > 1:
            return InFlight(result, None, None)
        logits, prompt = result
        sampled, feed = self._sample(logits, sampling)
        return InFlight(sampled, prompt if wants_prompt else None, feed)

    def fetch(self, step: InFlight) -> tuple[SamplerOutput, PromptLogprobsOutput | None]:
        """The result of a dispatched step, as ``execute`` returns it (waits for the step)."""
        return jax.device_get((step.result, step.prompt))

    def _no_targets(self, num_tokens: int):
        """[T] int32 of -1: no row wants prompt logprobs (on the device once per bucket)."""
        targets = self._empty_targets.get(num_tokens)
        if targets is None:
            targets = self._empty_targets[num_tokens] = self._place(
                np.full(num_tokens, -1, np.int32)
            )
        return targets

    def _place(self, array: np.ndarray):
        """``array`` on the runner's devices (replicated), where every step's inputs go."""
        if self.kv_sharding is None:
            return jax.device_put(array)
        replicated = NamedSharding(self.kv_sharding.mesh, PartitionSpec())
        if not replicated.is_fully_addressable:  # several processes: the step places it
            return array
        return jax.device_put(array, replicated)


@dataclasses.dataclass
class InFlight:
    """A dispatched step: its device results and the feed of its sampled tokens."""

    result: object  # SamplerOutput ([num_steps, R, ...] for a multi-step call)
    prompt: PromptLogprobsOutput | None  # when the step computed prompt logprobs
    feed: jax.Array | None  # [seq_cap] int32: the tokens it sampled (async scheduling)


def _deleted(leaf) -> bool:
    is_deleted = getattr(leaf, "is_deleted", None)
    return bool(is_deleted()) if is_deleted is not None else False
