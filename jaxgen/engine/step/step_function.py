"""The engine's jitted programs: the step (model + prompt logprobs, or a multi-step decode loop)
and the sampler every step's logits go through.

``jitted_step`` is composed of small pure pieces: ``forward`` (the model over the step's
tokens, its logits rows padded to the sampler's bucket), ``take_fed_tokens`` (asynchronous
scheduling: rows whose token the previous step sampled take it on the device),
``with_prompt_logprobs`` (the LM head on every token row, only when a row has a target) and
``scan_decode_steps`` (multi-step decoding: that many decode steps in one ``lax.scan``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.backends import KernelBackend
from jaxgen.engine.compiled.executable_store import StoredJit
from jaxgen.engine.sampling.prompt_logprobs import PROMPT_TOP, PromptLogprobsOutput, prompt_logprobs
from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_shapes import GENERAL_FLAGS


@functools.lru_cache(maxsize=16)
def jitted_step(graphdef, backend: KernelBackend):
    """The engine step, jitted once per model graph and backend: engines over the same model
    share compiled executables. The KV pool (argument 1) is donated so its updates are in place.

    A step runs the model and returns its logits rows (padded to ``sample_rows``, the sampler's
    row bucket) and every token row's prompt logprobs, computed only when a row has a target
    (``prompt_targets`` >= 0; None: none has, known on the host, and the step has no
    prompt-logprobs branch): its executable depends on the step's shape alone, and the
    sampler (``jitted_sampler``) is one executable per row bucket for every sampling
    configuration. A multi-step call (``num_steps``) samples inside its decode loop, with
    ``sampling_flags`` (static; the runner's, see ``ModelRunner.dispatch``). A speculative
    verify step is a step whose logits rows (``logits_indices``) hold its draft positions too,
    after its sequences' own (``VerifyShapes.merged``)."""

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
        sampling_flags=GENERAL_FLAGS,
        lora=None,
    ):
        if flat_params is not None:  # params and head came as their distinct arrays
            params, head = flat_params.unflatten(params)
        run = functools.partial(
            forward, graphdef, backend, params, head, logits_indices, logits_live, sample_rows, lora
        )
        if num_steps is not None:

            def decode_once(kv_cache, token_ids, positions, md, sampling):
                _, _, kv_cache, logits = run(kv_cache, token_ids, positions, md)
                return kv_cache, sample(logits, sampling, sampling_flags)

            return scan_decode_steps(
                decode_once,
                (kv_cache, token_ids, positions, md, sampling),
                num_steps=num_steps,
                page_size=page_size,
            )
        if from_previous is not None:
            token_ids = take_fed_tokens(token_ids, from_previous, previous_tokens)
        model, hidden, kv_cache, logits = run(kv_cache, token_ids, positions, md)
        prompt = None  # None: known on the host that no row wants prompt logprobs
        if prompt_targets is not None:
            prompt = with_prompt_logprobs(model, hidden, head, md, prompt_targets)
        return kv_cache, (logits, prompt)

    return StoredJit(
        step,
        "step",
        lambda: f"{graphdef!r}\n{backend!r}\n{native_kernels(backend)}",
        static_argnames=("sample_rows", "flat_params", "num_steps", "page_size", "sampling_flags"),
        donate_argnums=(1,),
        compiler_options=backend.compiler_options,
    )


def native_kernels(backend: KernelBackend) -> tuple[bool, ...]:
    """Which native CPU kernels the CPU backend's step calls (each falls back to JAX when its
    build or the CPU's instructions are missing); empty for other backends."""
    if backend.name != "cpu":
        return ()
    from jaxgen.backends.cpu_kernels import native_kernels_available

    return native_kernels_available()


def forward(
    graphdef,
    backend,
    params,
    head,
    logits_indices,
    logits_live,
    sample_rows,
    lora,
    kv_cache,
    token_ids,
    positions,
    md,
):
    """The model over the step's tokens (``token_ids``, ``positions`` [T]); returns the model,
    its hidden states [T, E], the updated pool and the logits rows [sample_rows, V] (only the
    rows that sample, ``logits_indices``, padded to the sampler's bucket; ``logits_live``: the
    ``[begin, end)`` spans of the real ones, so a head that skips padding rows does).
    ``lora``: the LoRA slots (``jaxgen.lora.LoRAStacks``) applied to each row by its
    ``md.lora_slots``, or None."""
    if lora is not None:
        params = lora.apply(params, md.lora_slots)
    model = nnx.merge(graphdef, params)
    hidden, kv_cache = model(token_ids, positions, kv_cache, md, backend=backend)
    logits = model.compute_logits(hidden[logits_indices], head_kernel=head, live_rows=logits_live)
    logits = jnp.pad(logits, ((0, sample_rows - logits.shape[0]), (0, 0)))
    return model, hidden, kv_cache, logits


def take_fed_tokens(token_ids, from_previous, previous_tokens):
    """Asynchronous scheduling: each row of ``token_ids`` [T] where ``from_previous`` [T] >= 0
    takes its token from ``previous_tokens`` (the feed of the step before, on the device)."""
    taken = previous_tokens[jnp.maximum(from_previous, 0)]  # [T]
    return jnp.where(from_previous >= 0, taken, token_ids)


def with_prompt_logprobs(model, hidden, head, md, prompt_targets) -> PromptLogprobsOutput:
    """Every token row's prompt logprobs (``prompt_targets`` [T]: the next prompt token, -1 for
    none); the LM head runs on every row only when some row has a target, else zeros."""

    def compute():
        all_logits = model.compute_logits(hidden, head_kernel=head, live_rows=md.live_rows)
        return prompt_logprobs(all_logits, prompt_targets, PROMPT_TOP)

    def without():
        rows = prompt_targets.shape[0]
        return PromptLogprobsOutput(
            jnp.zeros(rows, jnp.float32),
            jnp.zeros((rows, PROMPT_TOP), jnp.int32),
            jnp.zeros((rows, PROMPT_TOP), jnp.float32),
        )

    return jax.lax.cond(jnp.any(prompt_targets >= 0), compute, without)


def scan_decode_steps(decode_once, carry, *, num_steps: int, page_size: int):
    """``num_steps`` decode steps in one call (multi-step decoding): ``decode_once`` maps
    ``carry``, the first step's ``(kv_cache, token_ids, positions, md, sampling)``, to the
    pool and the sampler's output (its rows padded past the step's). The first step is
    decode-only: row r < num_seqs decodes sequence r and samples logits row r. Each step feeds
    the tokens it samples to the next, one position further (slots from the block tables, which
    cover them). Returns the pool and the sampler's outputs stacked ``[num_steps, S, ...]``."""

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


@functools.lru_cache(maxsize=16)
def jitted_sampler(feed_width: int):
    """The sampler of every step: ``(logits [R, V], sampling [R]) -> (SamplerOutput, feed)``
    with every stage on (``GENERAL_FLAGS``; a stage no row needs is skipped at run time), so
    one executable per row bucket serves every sampling configuration. ``feed``
    [feed_width] holds the sampled tokens by row, for the next step (asynchronous
    scheduling). ``flags`` (static) may name fewer stages: ``host_flags`` of a batch the host
    has read (on a GPU, see ``ModelRunner.dispatch``)."""

    def run(logits, sampling, flags=GENERAL_FLAGS):
        sampled = sample(logits, sampling, flags)
        feed = jnp.zeros(feed_width, jnp.int32).at[: sampled.token_ids.shape[0]]
        return sampled, feed.set(sampled.token_ids)

    return StoredJit(run, "sampler", lambda: str(feed_width), static_argnames=("flags",))
