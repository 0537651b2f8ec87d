"""The model runner: owns the parameters, the KV pool and the jitted step, and executes arrays.

It takes a step's host arrays (built by the engine: ``step_batch``), runs the step
(``step_function``) with the KV pool donated (updated in place) and the parameters as flat
arrays (``flat_params``), and returns the sampler's arrays in one device-to-host transfer. It
knows nothing of sequences or requests.
"""

from __future__ import annotations

import dataclasses
import gc
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.backends import KernelBackend, select_backend
from jaxgen.engine.compiled import compile_counter
from jaxgen.engine.sampling.prompt_logprobs import PromptLogprobsOutput
from jaxgen.engine.sampling.sampling_shapes import GENERAL_FLAGS, SamplingShapes, host_flags
from jaxgen.engine.sampling.sampling_tensors import SamplerOutput
from jaxgen.engine.step.call_times import CallTimes
from jaxgen.engine.step.flat_params import FlatParams
from jaxgen.engine.step.step_function import jitted_sampler, jitted_step


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
        attention_backend: str | KernelBackend = "auto",
        kv_sharding=None,
        per_batch_executables: bool | None = None,
        lora_slots=None,
        page_mover=None,
    ):
        """``lora_slots``: the LoRA device slots (``jaxgen.lora.LoRASlots``) every step takes,
        or None (no adapters); ``page_mover``: the host KV tier's ``KVPageMover``, or None."""
        compile_counter.install()
        self.lora_slots = lora_slots
        self.page_mover = page_mover
        self.config = loaded.config
        self.graphdef = loaded.graphdef
        self.params = loaded.params
        self.dtype = loaded.dtype
        self.page_size = page_size
        self.num_pages = num_pages
        self.backend = (
            attention_backend
            if isinstance(attention_backend, KernelBackend)
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
        # On a GPU, XLA runs a conditional it cannot capture in a command buffer on the host,
        # after copying its predicate back: a wait for the device in every step, which undid
        # asynchronous scheduling (batch 1: 9.1 ms a step for 4.6 ms of device time, H200,
        # 075a864, the sampler's greedy-or-sample conditional; batch 64 at 13f1313: 16.8 ms a
        # step for 7.5 ms, one of the optional stages' conditionals). There the host decides
        # what it knows: the sampler's flags come from the batch (``host_flags``: an all-greedy
        # batch with no penalty, logprobs, bias or mask has no conditional; at most four
        # samplers per row bucket) and a step without prompt-logprobs rows leaves that branch
        # out (its own executable, compiled when a prompt-logprobs step first comes).
        # Elsewhere one executable of each serves every batch, unless ``per_batch_executables``
        # (``EngineConfig.sampler_executables``) asks for the GPU's way: fewer stages compiled
        # for a run of a few known requests (``jaxgen generate``).
        if per_batch_executables is None:
            per_batch_executables = jax.default_backend() == "gpu"
        self.per_batch_executables = per_batch_executables
        # ``jaxgen bench``: each step waited for, its device time summed (no overlap then).
        self.time_device = False
        self.device_seconds = 0.0
        self.call_times: CallTimes | None = None  # dispatch and fetch times added (host_step)
        # Called with the parameter arrays and the new pool after each jitted step: a hook for
        # tests and fault matrices to fail a step as the device would (it may delete them).
        self.after_step = None
        # Called the same way as a step's result is about to be read: where a device error
        # surfaces, the step having consumed the donated pool (the same hook's uses).
        self.before_fetch = None
        # Called with each step's arguments as it is dispatched (``arrays``, ``prompt_targets``,
        # ``num_steps``, and whether its rows take the step before's feed): a hook for a
        # benchmark that keeps a step to replay it (``benchmarks/gpu/engine_run.py``).
        self.before_dispatch = None
        self.sampling_shapes = SamplingShapes(
            vocab_size=self.config.vocab_size,
            max_model_len=max_model_len,
            seq_cap=seq_cap,
            place=self._place,
        )
        self._sample = jitted_sampler(seq_cap)
        # Speculative decoding's ``VerifyShapes`` (set with a speculator): a verify step samples
        # its draft positions too, so its rows may pass the sequence cap.
        self.verify_shapes = None
        self._empty_targets: dict[int, jax.Array] = {}

    def _allocate_pool(self):
        return self.backend.allocate_kv_pool(
            self.config, self.num_pages, self.page_size, self.dtype, self.kv_sharding
        )

    def move_pages(self, offloads: list, onloads: list) -> None:
        """The host tier's page copies (``page_mover``): ``offloads`` read from the pool,
        then ``onloads`` written into it, before the next step runs."""
        if offloads:
            self.page_mover.offload(self.kv_cache, offloads)
        if onloads:
            self.kv_cache = self.page_mover.onload(self.kv_cache, onloads)

    def precompile_page_moves(self) -> None:
        """Compiles every bucket of the host tier's page copies (on the scratch page)."""
        self.kv_cache = self.page_mover.precompile(self.kv_cache)

    # -- weights that change, and sleep mode (``jaxgen.engine.weights``) -------------------------
    def set_params(self, params) -> None:
        """Steps run on ``params`` (an ``nnx.State`` laid out as the loaded one) from now on,
        put in the backend's form again; equal shapes, dtypes and shardings keep every
        compiled step (the parameters are the step's arguments)."""
        step_params, head_kernel = self.backend.prepare_params(params, self.config)
        arrays, flat = FlatParams.flatten(step_params, head_kernel)
        self.params, self.step_params, self.head_kernel = params, step_params, head_kernel
        self._param_arrays, self._flat_params = arrays, flat
        self._free_old_weights()

    def _free_old_weights(self) -> None:
        """Frees the weights let go of now: the executable store keeps the parameter list a
        step was last called with (so as not to walk it again), and parts of an old parameter
        state sit in reference cycles, which only a collection frees."""
        forget = getattr(self._step, "forget_arguments", None)
        if forget is not None:
            forget()
        gc.collect()

    def release_params(self, abstract) -> None:
        """Drops the parameters (sleep mode): ``params`` becomes ``abstract`` (their shapes);
        no step can run until ``set_params``."""
        self.params, self.step_params, self.head_kernel = abstract, None, None
        self._param_arrays = []
        self._free_old_weights()

    def release_pool(self) -> None:
        """Drops the KV pool (sleep mode) until ``allocate_pool``."""
        self.kv_cache = None

    def allocate_pool(self) -> None:
        """A zeroed KV pool of the layout and sharding the steps were compiled for."""
        self.kv_cache = self._allocate_pool()

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
        """Starts the step of ``execute`` without waiting for it (``_launch``); ``fetch``
        waits. With ``call_times`` set, the call's time is added to it."""
        args = (arrays, prompt_targets, from_previous, previous_tokens, num_steps)
        if self.before_dispatch is not None:
            self.before_dispatch(arrays, prompt_targets, num_steps, previous_tokens is not None)
        if self.call_times is None:
            return self._launch(*args)
        with self.call_times.measure("dispatch"):
            return self._launch(*args)

    def _launch(
        self, arrays: tuple, prompt_targets, from_previous, previous_tokens, num_steps: int
    ) -> InFlight:
        """``dispatch``'s work. With
        ``previous_tokens`` (asynchronous scheduling: the feed of the step before, on the
        device) the rows where ``from_previous`` [T] is >= 0 take their token from it.
        ``num_steps`` > 1 (a decode-only step whose block tables cover that many tokens
        more): that many decode steps, each fed the last one's tokens; the sampler's output
        is stacked ``[num_steps, R, ...]``. A speculative verify step's logits rows may
        outnumber the sequence cap (its draft positions after its sequences' rows): past it
        they take ``verify_shapes``' row buckets and a sampler of their own."""
        *inputs, sampling = arrays
        flags = GENERAL_FLAGS
        if self.per_batch_executables:
            flags = host_flags(sampling)
        shapes, sampler = self.sampling_shapes, self._sample
        if self.verify_shapes is not None:
            rows = sampling.temperature.shape[0]
            shapes = self.verify_shapes.shapes(rows)
            if shapes is not self.sampling_shapes:
                sampler = jitted_sampler(shapes.rows_for(rows))
        sampling = shapes.fit(sampling)
        sample_rows = sampling.temperature.shape[0]
        wants_prompt = prompt_targets is not None
        if not wants_prompt and not self.per_batch_executables:
            prompt_targets = self._no_targets(inputs[0].shape[0])
        extra = {}
        if num_steps > 1:
            extra = {"num_steps": num_steps, "page_size": self.page_size, "sampling": sampling}
            extra["sampling_flags"] = flags
        if previous_tokens is not None:
            extra |= {"from_previous": from_previous, "previous_tokens": previous_tokens}
        if self.lora_slots is not None:
            extra["lora"] = self.lora_slots.stacks
        start = time.perf_counter()
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
        if self.after_step is not None:  # a test's or a fault matrix's hook: it may raise
            self.after_step(self._param_arrays, self.kv_cache)
        if self.time_device:  # waits for the step: its device time, at the cost of overlap
            jax.block_until_ready(result)
            self.device_seconds += time.perf_counter() - start
        if num_steps > 1:
            return InFlight(result, None, None)
        logits, prompt = result
        sampled, feed = sampler(logits, sampling, flags=flags)
        return InFlight(sampled, prompt if wants_prompt else None, feed)

    def fetch(self, step: InFlight) -> tuple[SamplerOutput, PromptLogprobsOutput | None]:
        """The result of a dispatched step, as ``execute`` returns it (waits for the step)."""
        if self.before_fetch is not None:  # a test's or a fault matrix's hook: it may raise
            self.before_fetch(self._param_arrays, self.kv_cache)
        if self.call_times is None:
            return jax.device_get((step.result, step.prompt))
        with self.call_times.measure("wait"):
            return jax.device_get((step.result, step.prompt))

    def compiled_step(self, arrays: tuple):
        """The compiled executable that runs the single step of ``dispatch(arrays)`` (a step
        without prompt logprobs or the step before's feed): the executable store's, else the
        jit's, compiled now. For its memory analysis."""
        *inputs, sampling = arrays
        args = (self._param_arrays, self.kv_cache, *inputs)
        kwargs = dict(
            head=None,
            sample_rows=self.sampling_shapes.fit(sampling).temperature.shape[0],
            flat_params=self._flat_params,
        )
        if self.lora_slots is not None:
            kwargs["lora"] = self.lora_slots.stacks
        targets = None if self.per_batch_executables else self._no_targets(len(inputs[0]))
        stored = getattr(self._step, "stored", None)
        compiled = stored(*args, targets, **kwargs) if stored is not None else None
        if compiled is None:
            compiled = self._step.lower(*args, targets, **kwargs).compile()
        return compiled

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
