"""Exact top-k / top-p logit cutoffs by bisection over the whole vocabulary: the fallback the
sampler uses for rows whose kept set may exceed its ``MAX_CANDIDATES`` fast path."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_BISECTION_STEPS = 32  # enough to pin one float32 exactly


def bisection_cutoff(
    scaled: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    exact_top_k_rows: jax.Array,
    exact_top_p_rows: jax.Array | None,
) -> jax.Array:
    """Exact top_k-then-top_p cutoff over the whole vocabulary, without sorting; [B] f32.

    Bisects over float32 values (as order-preserving uint32 keys): the top_k cutoff is the largest
    value with at least top_k logits >= it; the top_p cutoff is the largest value whose logits
    >= it hold at least top_p of the top_k set's mass. Each bisection (32 passes over [B, V])
    only runs when some row needs it; other rows get -inf.

    Args:
        scaled: [B, V] temperature-scaled logits.
        top_k: [B] i32.
        top_p: [B] f32.
        exact_top_k_rows: [B] bool; rows whose top_k cutoff is needed.
        exact_top_p_rows: [B] bool, or None when no row uses top_p.
    """
    batch_size = scaled.shape[0]
    no_cutoff = jnp.full((batch_size,), -jnp.inf, jnp.float32)
    finite = jnp.isfinite(scaled)
    row_max = jnp.max(scaled, axis=-1)  # [B]
    row_min = jnp.min(jnp.where(finite, scaled, jnp.inf), axis=-1)  # [B]
    low = _float_to_ordered(row_min)
    high = _float_to_ordered(row_max)

    def top_k_cutoff():
        def at_least_k(threshold):
            return jnp.sum(scaled >= threshold[:, None], axis=-1) >= top_k

        kth_value = _ordered_to_float(_largest_satisfying(at_least_k, low, high))
        enough = jnp.sum(finite, axis=-1) >= top_k
        return jnp.where(exact_top_k_rows & enough, kth_value, -jnp.inf)

    floor = jax.lax.cond(jnp.any(exact_top_k_rows), top_k_cutoff, lambda: no_cutoff)
    if exact_top_p_rows is None:
        return floor

    def top_p_cutoff():
        weights = jnp.exp(scaled - jnp.where(jnp.isfinite(row_max), row_max, 0.0)[:, None])

        def mass_at_or_above(threshold):
            kept = scaled >= jnp.maximum(threshold, floor)[:, None]
            return jnp.sum(jnp.where(kept, weights, 0.0), axis=-1)

        target = top_p * mass_at_or_above(no_cutoff)

        def reaches_top_p(threshold):
            return mass_at_or_above(threshold) >= target

        nucleus_value = _ordered_to_float(_largest_satisfying(reaches_top_p, low, high))
        return jnp.where(exact_top_p_rows, jnp.maximum(floor, nucleus_value), floor)

    return jax.lax.cond(jnp.any(exact_top_p_rows), top_p_cutoff, lambda: floor)


def _largest_satisfying(predicate, low: jax.Array, high: jax.Array) -> jax.Array:
    """Largest uint32 key in [low, high] where ``predicate`` (monotone, true at ``low``) holds.

    Args:
        predicate: maps [B] float32 thresholds to [B] bool.
        low: [B] uint32 ordered keys.
        high: [B] uint32 ordered keys.
    """

    def step(_, bounds):
        low, high = bounds
        gap = high - low
        middle = low + (gap >> 1) + (gap & 1)
        ok = predicate(_ordered_to_float(middle))
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle - 1)

    low, _ = jax.lax.fori_loop(0, _BISECTION_STEPS, step, (low, high))
    return low


def _float_to_ordered(values: jax.Array) -> jax.Array:
    """float32 -> uint32 keys with the same order (for non-NaN values)."""
    bits = jax.lax.bitcast_convert_type(values.astype(jnp.float32), jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _ordered_to_float(keys: jax.Array) -> jax.Array:
    """Inverse of :func:`_float_to_ordered`."""
    positive = (keys >> 31) == 1
    bits = jnp.where(positive, keys & jnp.uint32(0x7FFFFFFF), ~keys)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)
