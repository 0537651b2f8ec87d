"""Speculative decoding of sampled rows. The acceptance rule alone (the engine's sampler at each
draft position, then ``accept``) against exact rejection sampling on small vocabularies; the
engine's speculative output against the target's distribution (chi-square, HF transformers
fp32 logits processed by hand) and, for seeded requests, token for token against decoding
without speculation; on a tiny random Llama with a 512-token vocabulary (sampling a row of
the full 49k vocabulary costs ~20 ms on a CPU)."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxgen import LLM, SamplingParams
from jaxgen.engine.decoding.speculative.draft_cost import DraftCost
from jaxgen.engine.decoding.speculative.verify_sampling import accept
from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_tensors import SamplingRow, build_sampling_tensors
from jaxgen.loaders import load_model
from tests.family_models import save_tiny_model

P_VALUE = 1e-3  # a correct sampler fails a test at this level once in a thousand seeds


def chi_square(counts: dict, probs: dict) -> float:
    """The p-value of ``counts`` (outcome -> count) under ``probs`` (outcome -> probability,
    summing to 1), outcomes with an expected count under 5 pooled into one cell."""
    total = sum(counts.values())
    assert set(counts) <= {o for o, p in probs.items() if p > 0}, "an impossible outcome"
    observed, expected, rest_observed, rest_expected = [], [], 0, 0.0
    for outcome, p in probs.items():
        if total * p >= 5:
            observed.append(counts.get(outcome, 0))
            expected.append(total * p)
        else:
            rest_observed += counts.get(outcome, 0)
            rest_expected += total * p
    if rest_expected > 0:
        observed.append(rest_observed)
        expected.append(rest_expected)
    expected = np.array(expected) * total / sum(expected)
    return float(chisquare(observed, expected).pvalue)


def _exact_outcomes(probs: np.ndarray, draft: list[int]) -> dict:
    """Rejection sampling's outcome distribution, from its definition (vLLM's rule for a draft
    without probabilities): draft token d_i is accepted with probability min(1, p_i(d_i) / 1);
    a rejected position draws from max(p_i - onehot(d_i), 0) renormalised; after k accepted
    tokens the bonus draws from p_k. ``probs`` [k + 1, V]: the target's distribution at each
    position given the draft before it. Outcome: the tuple of tokens kept."""
    outcomes, reach = {}, 1.0
    for i, token in enumerate(draft):
        residual = np.maximum(probs[i] - np.eye(probs.shape[1])[token], 0.0)
        accept_p = min(1.0, probs[i][token])
        if residual.sum() > 0:
            for y in np.flatnonzero(residual):
                outcome = (*draft[:i], int(y))
                rejection = reach * (1 - accept_p) * residual[y] / residual.sum()
                outcomes[outcome] = outcomes.get(outcome, 0.0) + rejection
        reach *= accept_p
    for y in np.flatnonzero(probs[-1]):
        outcomes[(*draft, int(y))] = reach * probs[-1][y]
    return outcomes


_SAMPLE = jax.jit(sample, static_argnums=2)


@pytest.mark.parametrize("ranks", [[1, 0], [1, 1], [0, 2], [5, 0]])
def test_acceptance_is_rejection_sampling(ranks):
    """The verify rule (the engine's sampler at every position with the keys the engine gives
    them, then ``accept``) against the exact rejection-sampling distribution, on a vocabulary
    of 6 whose distribution a temperature and top_k shape. The draft token at position i is
    the ``ranks[i]``-th most likely one (rank 5: outside top_k, never kept)."""
    vocab, draws = 6, 3000
    rng = np.random.default_rng(sum(ranks) + len(ranks))
    logits = rng.normal(size=(len(ranks) + 1, vocab)).astype(np.float32)
    params = SamplingParams(temperature=0.7, top_k=4)
    # The processed distributions the engine samples: temperature, then top_k.
    scaled = logits.astype(np.float64) / params.temperature
    kept = scaled >= np.sort(scaled, axis=1)[:, -params.top_k][:, None]
    probs = np.where(kept, np.exp(scaled - scaled.max(axis=1, keepdims=True)), 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    draft = [int(np.argsort(-probs[i], kind="stable")[rank]) for i, rank in enumerate(ranks)]

    # One sampler row per (draw, position): seed = the draw, step = the position, as the
    # engine keys a seeded request's draft positions and bonus.
    rows = [
        SamplingRow(SamplingParams(temperature=0.7, top_k=4, seed=seed), (), [0] * i)
        for seed in range(draws)
        for i in range(len(draft) + 1)
    ]
    tensors, flags = build_sampling_tensors(rows, len(rows), base_seed=0, step_counter=0)
    batch_logits = np.tile(logits, (draws, 1))
    output = jax.device_get(_SAMPLE(batch_logits, tensors, flags))
    sampled = output.token_ids.reshape(draws, len(draft) + 1)
    counts = {}
    for row in sampled:
        kept_tokens = tuple(accept(draft, row.tolist()))
        counts[kept_tokens] = counts.get(kept_tokens, 0) + 1
    exact = _exact_outcomes(probs, draft)
    assert abs(sum(exact.values()) - 1) < 1e-9
    assert chi_square(counts, exact) > P_VALUE
    # The acceptance rate of the first draft token is p_0(d_0).
    accepted = sum(c for o, c in counts.items() if len(o) > 1)
    assert abs(accepted / draws - probs[0][draft[0]]) < 4 * np.sqrt(0.25 / draws)


def _coupled_agreement(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[V]: the probability that Gumbel-max draws from ``p`` and from ``q`` [V] with the same
    noise both pick token x: x's exponential race time E_x / p_x beats every other token's
    under both, 1 / sum_y max(p_y / p_x, q_y / q_x) (0 where p_x or q_x is 0)."""
    both = (p > 0) & (q > 0)
    ratios = np.maximum(
        p[None, :] / np.where(both, p, 1)[:, None], q[None, :] / np.where(both, q, 1)[:, None]
    )
    return np.where(both, 1 / ratios.sum(axis=1), 0.0)


def _processed(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    """[N, V] probabilities after ``temperature`` and ``top_k``, as the sampler applies them."""
    scaled = logits.astype(np.float64) / temperature
    kept = scaled >= np.sort(scaled, axis=1)[:, -top_k][:, None]
    probs = np.where(kept, np.exp(scaled - scaled.max(axis=1, keepdims=True)), 0.0)
    return probs / probs.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("spread", [0.5, 1.5])
def test_sampled_draft_acceptance(spread):
    """A draft sampled from q (not one-hot) with the key the verify step uses at its position:
    the engine's sampler draws the draft from q and the target token from p on the same keys,
    ``accept`` keeps the draft token where they agree. Against the exact numbers: the first
    position's acceptance rate is the coupled agreement sum_x 1 / sum_y max(p_y/p_x, q_y/q_x),
    at least (1 - TV) / (1 + TV) and above an independent draw's sum_x p_x q_x; the kept
    token's distribution is p; a rejected position's token has the residual distribution
    (p_x - agreement_x) / (1 - acceptance), the target's mass the draft did not take."""
    vocab, draws, k, temperature, top_k = 6, 3000, 2, 0.7, 4
    rng = np.random.default_rng(int(spread * 10))
    target_logits = rng.normal(size=(k + 1, vocab)).astype(np.float32)
    draft_logits = (target_logits + spread * rng.normal(size=(k + 1, vocab))).astype(np.float32)
    p = _processed(target_logits, temperature, top_k)  # [k + 1, V]
    q = _processed(draft_logits, temperature, top_k)

    def draw(logits):  # [draws, k + 1]: seed = the draw, step = the position
        params = SamplingParams(temperature=temperature, top_k=top_k)
        rows = [
            SamplingRow(dataclasses.replace(params, seed=seed), (), [0] * i)
            for seed in range(draws)
            for i in range(k + 1)
        ]
        tensors, flags = build_sampling_tensors(rows, len(rows), base_seed=0, step_counter=0)
        output = jax.device_get(_SAMPLE(np.tile(logits, (draws, 1)), tensors, flags))
        return output.token_ids.reshape(draws, k + 1)

    drafts, targets = draw(draft_logits), draw(target_logits)
    kept = [accept(d[:k].tolist(), t.tolist()) for d, t in zip(drafts, targets, strict=True)]
    # The draft is drawn from q.
    draft_counts = dict(zip(*np.unique(drafts[:, 0], return_counts=True), strict=True))
    assert chi_square(draft_counts, dict(enumerate(q[0]))) > P_VALUE
    # Acceptance of position 0, exactly.
    agreement = _coupled_agreement(p[0], q[0])
    acceptance = agreement.sum()
    tv = 0.5 * np.abs(p[0] - q[0]).sum()
    assert acceptance >= (1 - tv) / (1 + tv) - 1e-12
    assert acceptance > (p[0] * q[0]).sum()
    accepted = np.mean([len(tokens) > 1 for tokens in kept])
    assert abs(accepted - acceptance) < 4 * np.sqrt(acceptance * (1 - acceptance) / draws)
    # The kept token is distributed as p; a rejected one as the residual.
    first = dict(zip(*np.unique([t[0] for t in kept], return_counts=True), strict=True))
    assert chi_square(first, dict(enumerate(p[0]))) > P_VALUE
    residual = (p[0] - agreement) / (1 - acceptance)
    rejected = [t[0] for t in kept if len(t) == 1]
    counts = dict(zip(*np.unique(rejected, return_counts=True), strict=True))
    assert chi_square(counts, dict(enumerate(residual))) > P_VALUE


def test_accept():
    assert accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted, then the bonus
    assert accept([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # rejected at 1: the sampled token
    assert accept([5], [4, 8]) == [4]


# Sampled rows. Five tokens get a logit bias that makes them the top_k = 5 set at every
# position (the random model's logits spread far less), the last one the draft token; the
# prompt holds "61 62 c 505 505" for each of them, so whatever the first token c is, 3-gram
# prompt lookup drafts 505 twice after it (accepted with about a fifth of the mass). The
# prompt fills two pages (prefix-cached after the first request) plus one token.
BOOSTED = [101, 202, 303, 404, 505]
DRAFT_TOKEN = 505
SAMPLED_PROMPT = [t for c in BOOSTED for t in (61, 62, c, DRAFT_TOKEN, DRAFT_TOKEN)]
SAMPLED_PROMPT += [90, 91, 92, 93, 94, 95, 61, 62]
TEMPERATURE, FREQUENCY_PENALTY, BIAS = 0.5, 0.6, 8.0
NUM_DRAWS = 400


def sampled(seed, **fields):
    return SamplingParams(
        temperature=TEMPERATURE,
        top_k=len(BOOSTED),
        logit_bias=dict.fromkeys(BOOSTED, BIAS),
        frequency_penalty=FREQUENCY_PENALTY,
        seed=seed,
        max_tokens=4,
        ignore_eos=True,
        **fields,
    )


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    return save_tiny_model(
        str(tmp_path_factory.mktemp("tiny-llama-512")), smollm2_tokenizer, vocab_size=512
    )


@pytest.fixture(scope="module")
def engines(small_vocab_dir):
    """The plain and the speculating engine (k = 2, 3-gram lookup); they share executables."""
    loaded = load_model(small_vocab_dir)
    knobs = dict(
        max_model_len=64,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=4,
        page_size=16,
        precompile=False,
    )
    speculative = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    speculating = LLM(loaded, **knobs, speculative_config=speculative)
    # Whole drafts at every step, whatever they cost: these tests need rejections by the hundred.
    speculating.engine.speculator.cost = _Unmeasured()
    return LLM(loaded, **knobs), speculating


class _Unmeasured(DraftCost):
    """A draft's cost never known: drafts are not shortened to what pays."""

    def relative(self, rows: int, drafted: int) -> None:
        return None


@pytest.fixture(scope="module")
def sampled_draws(engines):
    """Four tokens (k = 2 drafted after the first) of ``NUM_DRAWS`` seeded requests, and how
    many draft tokens were proposed and accepted meanwhile."""
    speculating = engines[1]
    before = speculating.stats()
    params = [sampled(seed, logprobs=2) for seed in range(NUM_DRAWS)]
    outputs = speculating.generate([SAMPLED_PROMPT] * NUM_DRAWS, params, use_tqdm=False)
    after = speculating.stats()
    counts = {
        key: after[key] - before[key]
        for key in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
    }
    counts["second"] = (
        after["spec_decode_num_accepted_tokens_per_pos"][1]
        - before["spec_decode_num_accepted_tokens_per_pos"][1]
    )
    return outputs, counts


def target_probs(model_dir) -> dict:
    """The target's processed distribution of tokens 1-3, exactly: HF transformers fp32 logits
    after every prefix of boosted tokens, then logit bias, frequency penalty, temperature and
    top_k by hand over the whole vocabulary. prefix (tuple) -> {token: probability}."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    probs = {}
    for length in (0, 1, 2):
        group = list(itertools.product(BOOSTED, repeat=length))
        with torch.no_grad():
            ids = torch.tensor([SAMPLED_PROMPT + list(prefix) for prefix in group])
            logits = model(ids).logits[:, -1].double().numpy()  # [N, V]
        for prefix, row in zip(group, logits, strict=True):
            row[BOOSTED] += BIAS
            for token in prefix:  # once per occurrence in the output
                row[token] -= FREQUENCY_PENALTY
            row /= TEMPERATURE
            top = np.argsort(-row)[: len(BOOSTED)]
            weights = np.exp(row[top] - row[top].max())
            probs[prefix] = dict(zip(top.tolist(), (weights / weights.sum()).tolist(), strict=True))
    return probs


def test_sampled_rows_have_the_target_distribution(sampled_draws, small_vocab_dir):
    """Chi-square goodness of fit, over fixed seeds, of the first drafted position (token 2)
    and of the first two (tokens 2 and 3 jointly: penalties see the accepted draft token)
    against the target's distribution; drafts are accepted and rejected often."""
    outputs, counts = sampled_draws
    probs = target_probs(small_vocab_dir)
    assert set(probs[()]) == set(BOOSTED)  # the bias decides the top_k set
    exact_first, exact_both, first, both = {}, {}, {}, {}
    for a, p_a in probs[()].items():
        for b, p_b in probs[(a,)].items():
            exact_first[b] = exact_first.get(b, 0.0) + p_a * p_b
            for c, p_c in probs[(a, b)].items():
                exact_both[(b, c)] = exact_both.get((b, c), 0.0) + p_a * p_b * p_c
    for output in outputs:
        tokens = tuple(output.outputs[0].token_ids)
        first[tokens[1]] = first.get(tokens[1], 0) + 1
        both[tokens[1:3]] = both.get(tokens[1:3], 0) + 1
    assert chi_square(first, exact_first) > P_VALUE
    assert chi_square(both, exact_both) > P_VALUE
    assert counts["spec_decode_num_draft_tokens"] >= 2 * NUM_DRAWS
    rate = counts["spec_decode_num_accepted_tokens"] / counts["spec_decode_num_draft_tokens"]
    assert 0.05 < rate < 0.5  # (p + p^2) / 2 for p ~ 0.2: rejected drafts reject two tokens
    assert counts["second"] > 0  # second draft positions were accepted too


def test_seeded_sampled_rows_match_plain_decoding(sampled_draws, engines):
    """A seeded request draws the token at each output position with that position's key,
    speculating or not: the same tokens and logprobs as without speculation."""
    outputs, _ = sampled_draws
    params = [sampled(seed, logprobs=2) for seed in range(24)]
    expected = engines[0].generate([SAMPLED_PROMPT] * len(params), params, use_tqdm=False)
    for want, have in zip(expected, outputs, strict=False):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
        for mine, theirs in zip(have.outputs[0].logprobs, want.outputs[0].logprobs, strict=True):
            assert mine.keys() == theirs.keys()
            for token in mine:
                assert _logprob(mine[token]) == pytest.approx(_logprob(theirs[token]), abs=1e-4)


def _logprob(entry) -> float:
    return getattr(entry, "logprob", entry)
