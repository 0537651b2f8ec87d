"""Whole KV pages copied between the runner's pool and host memory: the host tier's offloads
(device -> host) and onloads (host -> device), ``jaxgen.engine.scheduling.host_kv_tier``.

Each pool leaf (a layer's K or V, an 8-bit pool's codes and scales) has one axis indexed by
page; which one is read off the backend's own pool shapes (the axis that grows with the page
count), so every backend's layout, and a pool split over devices, moves alike. A move is one
jitted gather or one jitted, donated scatter over a bucket of page indices (powers of two, at
most ``MAX_BUCKET``; padding indices name the scratch page, whose contents nothing reads), so
steady state compiles nothing once each bucket ran (``precompile``). Offloads run before
onloads: a page freed for an onload may be one whose contents are still being offloaded.
The host copies are numpy arrays (one pytree a page), read with ``jax.device_get``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

SCRATCH_PAGE = 0
MAX_BUCKET = 64


def page_axes(backend, model_config, page_size: int, dtype) -> tuple[int, ...]:
    """Each pool leaf's page axis, in ``jax.tree_util`` leaf order."""
    one = jax.tree_util.tree_leaves(backend.kv_pool_shapes(model_config, 1, page_size, dtype))
    two = jax.tree_util.tree_leaves(backend.kv_pool_shapes(model_config, 2, page_size, dtype))
    axes = []
    for a, b in zip(one, two, strict=True):
        grown = [i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]
        if len(grown) != 1:
            raise ValueError(f"a KV pool leaf of shape {a.shape} has no single page axis")
        axes.append(grown[0])
    return tuple(axes)


@functools.partial(jax.jit, static_argnums=2)
def _gather(pool, pages, axes):  # pages [N] int32 -> each leaf's N pages
    leaves = jax.tree_util.tree_leaves(pool)
    return [jnp.take(leaf, pages, axis=axis) for leaf, axis in zip(leaves, axes, strict=True)]


@functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
def _scatter(pool, pages, data, axes):  # the pool with pages [N] set from data (leaf order)
    leaves, tree = jax.tree_util.tree_flatten(pool)
    out = []
    for leaf, new, axis in zip(leaves, data, axes, strict=True):
        index = (slice(None),) * axis + (pages,)
        out.append(leaf.at[index].set(new.astype(leaf.dtype)))
    return jax.tree_util.tree_unflatten(tree, out)


def _buckets(moves: list):
    """``moves`` in chunks of at most ``MAX_BUCKET``, each with its page indices padded to a
    power of two."""
    for start in range(0, len(moves), MAX_BUCKET):
        chunk = moves[start : start + MAX_BUCKET]
        size = 1 << (len(chunk) - 1).bit_length()
        pages = [page for page, _ in chunk] + [SCRATCH_PAGE] * (size - len(chunk))
        yield chunk, np.array(pages, np.int32)


class KVPageMover:
    """Copies pages of a runner's pool to and from host memory."""

    def __init__(self, axes: tuple[int, ...]):
        self.axes = axes
        self.offloaded_pages = 0
        self.onloaded_pages = 0

    def offload(self, pool, moves) -> None:
        """Gives each ``(page, host_page)`` of ``moves`` its page's K/V (``host_page.data``:
        the pool leaves' page slices, numpy, in leaf order)."""
        for chunk, index in _buckets(moves):
            gathered = jax.device_get(_gather(pool, index, self.axes))
            for i, (_, copy) in enumerate(chunk):
                copy.data = [
                    np.take(leaf, i, axis=axis)
                    for leaf, axis in zip(gathered, self.axes, strict=True)
                ]
            self.offloaded_pages += len(chunk)

    def onload(self, pool, moves):
        """``pool`` (donated) with each ``(page, host_page)`` of ``moves`` written from the
        host copy; returns the new pool."""
        for chunk, index in _buckets(moves):
            data = []
            for leaf, axis in enumerate(self.axes):
                pages = [copy.data[leaf] for _, copy in chunk]
                pages += [np.zeros_like(pages[0])] * (len(index) - len(chunk))
                data.append(np.stack(pages, axis=axis))
            pool = _scatter(pool, index, data, self.axes)
            self.onloaded_pages += len(chunk)
        return pool

    def precompile(self, pool):
        """Runs each bucket's gather and scatter once on the scratch page (nothing reads it),
        so no move compiles later; returns the pool."""
        size = 1
        while size <= MAX_BUCKET:
            index = np.full(size, SCRATCH_PAGE, np.int32)
            gathered = jax.device_get(_gather(pool, index, self.axes))
            pool = _scatter(pool, index, gathered, self.axes)
            size *= 2
        return pool
