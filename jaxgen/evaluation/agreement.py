"""How close a quantised model's next-token distributions are to a float model's: teacher-forced
top-1 agreement and the mean |Δ log-probability| of the float model's own greedy tokens."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.backends import select_backend
from jaxgen.layers.attention import AttentionMetadata

# Chat prompts the agreement measurements continue greedily.
PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of Japan?",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "How do I boil an egg?",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
    "Give me a name for a pet turtle.",
    "What does a compiler do?",
    "Describe a rainy day.",
    "Who wrote Romeo and Juliet?",
    "Suggest a healthy breakfast.",
    "What is 12 times 12?",
    "Summarise the plot of Cinderella.",
    "What is machine learning?",
    "Tell me a fun fact about octopuses.",
    "How far is the Moon from Earth?",
    "What is the boiling point of water?",
    "Recommend a book for a long flight.",
    "What is a black hole?",
    "How do bees make honey?",
    "Write a short thank-you note.",
    "What causes the seasons?",
    "Name a famous painter.",
    "How do plants drink water?",
    "What is the tallest mountain?",
    "Give two tips for better sleep.",
    "What is an atom?",
    "Describe the taste of lemon.",
    "What is the speed of light?",
    "Why do cats purr?",
    "What is a haiku?",
]


def greedy_sequences(llm, prompts, max_tokens: int) -> tuple[np.ndarray, int]:
    """Each chat prompt left-aligned at a common start (the longest prompt's length, earlier
    positions padded by repeating its first token) followed by the float model's greedy tokens."""
    from jaxgen.sampling_params import SamplingParams

    outputs = llm.chat(
        [[{"role": "user", "content": p}] for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        use_tqdm=False,
    )
    first = max(len(o.prompt_token_ids) for o in outputs)
    rows = []
    for out in outputs:
        prompt = list(out.prompt_token_ids)
        rows.append([prompt[0]] * (first - len(prompt)) + prompt + list(out.outputs[0].token_ids))
    return np.asarray(rows), first


@dataclasses.dataclass(frozen=True)
class Agreement:
    tokens: int  # teacher-forced positions compared
    top1: float  # fraction where the candidate's argmax equals the reference's
    mean_abs_logprob_delta: float  # over the reference's argmax tokens
    max_abs_logit_delta: float


def sequence_logits(
    loaded,
    sequences: np.ndarray,
    *,
    page_size: int = 16,
    backend: str = "auto",
    kv_cache_dtype: str = "auto",
) -> np.ndarray:  # [S, L] token ids -> [S, L, V] float32
    """Logits at every position of equal-length ``sequences``, one prefill step of all of them
    (``backend`` prepares the parameters as an engine would: the "cpu" one packs them; every
    query attends to keys and values read back from a ``kv_cache_dtype`` pool)."""
    num_seqs, length = sequences.shape
    attention_backend = select_backend(backend, dtype=loaded.dtype, kv_cache_dtype=kv_cache_dtype)
    params, head = attention_backend.prepare_params(loaded.params, loaded.config)
    pages = -(-length // page_size)
    kv = attention_backend.allocate_kv_pool(
        loaded.config, num_seqs * pages + 1, page_size, loaded.dtype
    )
    tables = 1 + np.arange(num_seqs * pages, dtype=np.int32).reshape(num_seqs, pages)
    positions = np.tile(np.arange(length, dtype=np.int32), num_seqs)
    slots = tables[np.repeat(np.arange(num_seqs), length), positions // page_size] * page_size
    md = AttentionMetadata(
        slot_mapping=(slots + positions % page_size).astype(np.int32),
        cu_q_lens=(np.arange(num_seqs + 1) * length).astype(np.int32),
        kv_lens=np.full(num_seqs, length, np.int32),
        block_tables=tables,
        num_seqs=np.array([num_seqs], np.int32),
        live_rows=np.array([[0, 0], [0, num_seqs * length]], np.int32),
    )
    run = _forward(loaded.graphdef, attention_backend)
    logits = run(params, kv, sequences.reshape(-1).astype(np.int32), positions, md, head)
    return np.asarray(logits).reshape(num_seqs, length, -1)


@functools.lru_cache(maxsize=8)
def _forward(graphdef, backend):
    @jax.jit
    def run(params, kv, ids, positions, md, head):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(ids, positions, kv, md, backend=backend)
        return model.compute_logits(hidden, head_kernel=head, live_rows=md.live_rows)

    return run


def teacher_forced_agreement(
    reference,
    candidate,
    sequences: np.ndarray,  # [S, L] prompt + the reference's greedy continuation
    first: int,  # positions first - 1 .. L - 2 predict the continuation's tokens
    *,
    chunk: int = 4,
    backend: str = "auto",
    candidate_kv_cache_dtype: str = "auto",
) -> Agreement:
    """Compares ``candidate``'s teacher-forced predictions (its pool ``candidate_kv_cache_dtype``)
    with ``reference``'s (float pool), ``chunk`` sequences per forward pass."""
    top1 = delta_logprob = max_logit = 0.0
    count = 0
    for start in range(0, len(sequences), chunk):
        batch = sequences[start : start + chunk]
        ref = sequence_logits(reference, batch, backend=backend)[:, first - 1 : -1]
        cand = sequence_logits(
            candidate, batch, backend=backend, kv_cache_dtype=candidate_kv_cache_dtype
        )[:, first - 1 : -1]
        greedy = ref.argmax(-1)
        top1 += float((cand.argmax(-1) == greedy).sum())
        ref_lp = jax.nn.log_softmax(jnp.asarray(ref), -1)
        cand_lp = jax.nn.log_softmax(jnp.asarray(cand), -1)
        picked = np.take_along_axis(np.asarray(ref_lp - cand_lp), greedy[..., None], -1)
        delta_logprob += float(np.abs(picked).sum())
        max_logit = max(max_logit, float(np.abs(ref - cand).max()))
        count += greedy.size
    return Agreement(count, top1 / count, delta_logprob / count, max_logit)
