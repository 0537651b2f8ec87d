"""The sampler's logit processors, in vLLM's order: ``logit_bias`` added, banned tokens and
tokens a grammar forbids set to -inf, repetition, frequency and presence penalties. Each takes
and returns [B, V] logits and is an exact no-op on the rows that do not ask for it
(``sampler.sample`` runs them, each only in steps where a row needs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MAX_BANNED_BY_COMPARISON = 16  # wider ban lists use a scatter

__all__ = ["add_logit_bias", "apply_penalties", "apply_token_bitmask", "ban_tokens"]


def add_logit_bias(logits: jax.Array, bias_ids: jax.Array, bias_values: jax.Array) -> jax.Array:
    """Adds each row's ``logit_bias`` (a no-op, traced away, when the table is empty).

    Args:
        logits: [B, V] float logits.
        bias_ids: [B, K] token ids, padded with -1.
        bias_values: [B, K] biases (0 for padding).
    """
    if bias_ids.shape[1] == 0:
        return logits
    rows = jnp.arange(logits.shape[0])[:, None]
    ids = _drop_padding(bias_ids, logits.shape[1])
    return logits.at[rows, ids].add(bias_values.astype(jnp.float32), mode="drop")


def ban_tokens(logits: jax.Array, banned_token_ids: jax.Array) -> jax.Array:
    """Set the banned tokens' logits to -inf.

    Args:
        logits: [B, V] float logits.
        banned_token_ids: [B, K] token ids, padded with -1.
    """
    num_banned = banned_token_ids.shape[1]
    if num_banned == 0:
        return logits
    if num_banned <= _MAX_BANNED_BY_COMPARISON:
        # Elementwise comparisons fuse into the consumers; a scatter would copy [B, V] first.
        token_index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        banned = jnp.zeros(logits.shape, bool)
        for column in range(num_banned):
            banned = banned | (token_index == banned_token_ids[:, column : column + 1])
        return jnp.where(banned, -jnp.inf, logits)
    rows = jnp.arange(logits.shape[0])[:, None]
    ids = _drop_padding(banned_token_ids, logits.shape[1])
    return logits.at[rows, ids].set(-jnp.inf, mode="drop")


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array, constrained: jax.Array) -> jax.Array:
    """Set the logits of tokens a row's grammar forbids to -inf (constrained rows only).

    Args:
        logits: [B, V] float logits.
        bitmask: [B, W] int32, bit ``j`` of word ``w`` set iff token ``32 * w + j`` is allowed;
            tokens at or past ``32 * W`` are forbidden.
        constrained: [B] bool; other rows are left as they are.
    """
    batch_size, vocab_size = logits.shape
    shifts = jnp.arange(32, dtype=jnp.uint32)
    words = jax.lax.bitcast_convert_type(bitmask, jnp.uint32)  # [B, W]
    bits = (words[:, :, None] >> shifts) & 1  # [B, W, 32]
    allowed = bits.reshape(batch_size, -1).astype(bool)  # [B, 32 * W]
    width = allowed.shape[1]
    if width >= vocab_size:
        allowed = allowed[:, :vocab_size]
    else:
        allowed = jnp.pad(allowed, ((0, 0), (0, vocab_size - width)))
    return jnp.where(constrained[:, None] & ~allowed, -jnp.inf, logits)


def apply_penalties(
    logits: jax.Array,
    prompt_token_ids: jax.Array,
    output_token_ids: jax.Array,
    repetition_penalty: jax.Array,
    presence_penalty: jax.Array,
    frequency_penalty: jax.Array,
) -> jax.Array:
    """Apply vLLM's penalties without materialising [B, V] masks.

    Repetition (HF semantics, once per distinct token of prompt or output): ``logit / penalty``
    if ``logit > 0`` else ``logit * penalty``; then, for tokens of the output,
    ``logit -= frequency * count + presence``.

    Args:
        logits: [B, V] float logits.
        prompt_token_ids: [B, Lp] prompt tokens, padded with -1.
        output_token_ids: [B, Lo] generated tokens, padded with -1.
        repetition_penalty: [B] (1 = off).
        presence_penalty: [B] (0 = off).
        frequency_penalty: [B] (0 = off).
    """
    batch_size, vocab_size = logits.shape
    rows = jnp.arange(batch_size)[:, None]
    seen = jnp.concatenate([prompt_token_ids, output_token_ids], axis=1)  # [B, Lp + Lo]
    if seen.shape[1]:
        seen = _drop_padding(seen, vocab_size)
        current = jnp.take_along_axis(logits, jnp.minimum(seen, vocab_size - 1), axis=-1)
        penalty = repetition_penalty[:, None].astype(jnp.float32)
        penalised = jnp.where(current > 0, current / penalty, current * penalty)
        # Duplicate ids write the same value, so a token is penalised once however often it occurs.
        logits = logits.at[rows, seen].set(penalised, mode="drop")
    if output_token_ids.shape[1]:
        output = jnp.sort(_drop_padding(output_token_ids, vocab_size), axis=-1)  # [B, Lo]
        first = jnp.concatenate(
            [jnp.ones((batch_size, 1), bool), output[:, 1:] != output[:, :-1]], axis=1
        )
        # Scatter-add sums duplicates: frequency once per occurrence, presence once per token.
        delta = -(frequency_penalty[:, None] + presence_penalty[:, None] * first)
        logits = logits.at[rows, output].add(delta.astype(jnp.float32), mode="drop")
    return logits


def _drop_padding(token_ids: jax.Array, vocab_size: int) -> jax.Array:
    """Map padding (-1) and out-of-range ids to ``vocab_size`` so scatters with mode='drop'
    ignore them (negative indices would otherwise wrap around)."""
    valid = (token_ids >= 0) & (token_ids < vocab_size)
    return jnp.where(valid, token_ids, vocab_size).astype(jnp.int32)
