"""Many ``QuantizedWeight``s packed into the native kernel's panels in flat buffers they share
(:func:`pack_shared`), the host buffers kept in ``jaxgen.caches.array_cache`` between runs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxgen.backends.cpu_kernels import matmul_quantized
from jaxgen.backends.cpu_kernels.matmul_quantized import (
    QUANT_PANEL,
    PackedQuantizedWeight,
    packed_fields,
    packed_form,
)
from jaxgen.caches import array_cache
from jaxgen.caches.array_cache import ArrayCache, content_key
from jaxgen.quantization import QuantizedWeight

# Elements per shared buffer (at most): offsets inside one stay int32 for the in-place writes.
SHARED_BUFFER_ELEMENTS = 1 << 30
PACKED_FIELDS = ("values", "scales", "mins", "scale_codes", "min_codes")
PACKING_FORMAT = 2  # bump when the panels' layout changes (keys the packed-weights cache)


def _packed_layout(weight: QuantizedWeight) -> PackedQuantizedWeight:
    """``PackedQuantizedWeight.pack(weight)`` with ``jax.ShapeDtypeStruct`` fields, from the
    shapes alone."""
    weight = packed_form(
        jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), weight)
    )
    panels = -(-weight.shape[1] // QUANT_PANEL)

    def panelled(array):  # [R, N] -> [P, R, 16]
        return jax.ShapeDtypeStruct((panels, array.shape[0], QUANT_PANEL), array.dtype)

    def maybe(leaf):
        return None if leaf is None else panelled(leaf)

    if weight.two_level:
        return PackedQuantizedWeight(
            panelled(weight.values), panelled(weight.scales), maybe(weight.mins),
            **packed_fields(weight), scale_codes=panelled(weight.scale_codes),
            min_codes=maybe(weight.min_codes),
        )  # fmt: skip
    mins = None
    if (weight.kind == "int4" and weight.codebook is None) or weight.mins is not None:
        mins = panelled(weight.mins if weight.mins is not None else weight.scales)
    return PackedQuantizedWeight(
        panelled(weight.values), panelled(weight.scales), mins, **packed_fields(weight)
    )


def _shared_host_buffers(weights, placed, sizes) -> dict[tuple, np.ndarray]:
    """``pack_shared``'s host buffers (``(field, dtype), index`` -> flat array): read from
    their ``jaxgen.caches.array_cache`` entry, keyed by the weights' contents (a SHA-256 of
    their leaves, ~0.07 s per 100 MB against ~0.5 s to pack the default model), else packed
    here and written there for the next run (weights under ``array_cache.MIN_BYTES``: packed,
    not cached)."""
    leaves = [leaf for weight in weights for leaf in jax.tree_util.tree_leaves(weight)]
    if sum(leaf.nbytes for leaf in leaves) < array_cache.MIN_BYTES or any(
        isinstance(leaf, jax.core.Tracer) for leaf in leaves
    ):
        return _pack_host_buffers(weights, placed, sizes)
    described = [
        (w.kind, w.group_size, list(w.shape), w.activations, w.scales.dtype.name, w.mins is None)
        + (w.groups_per_super if w.two_level else 0, w.min_codes is None, w.codebook)
        + (matmul_quantized.LOOK_UP_CODEBOOKS,)
        for w in weights
    ]
    key = {
        "weights": described,
        "contents": content_key(leaves),
        "format": PACKING_FORMAT,
        "buffer_elements": SHARED_BUFFER_ELEMENTS,
    }
    cache = ArrayCache("cpu-packed", key)
    names = {
        (field_dtype, index): f"{field_dtype[0]}-{field_dtype[1].str}-{index}"
        for field_dtype, chunks in sizes.items()
        for index in range(len(chunks))
    }
    stored = cache.load()
    if stored is not None and all(
        name in stored and stored[name].size == sizes[place[0]][place[1]]
        for place, name in names.items()
    ):
        return {place: stored[name] for place, name in names.items()}
    host = _pack_host_buffers(weights, placed, sizes)
    cache.save({name: host[place] for place, name in names.items()})
    return host


def _pack_host_buffers(weights, placed, sizes) -> dict[tuple, np.ndarray]:
    """Packs ``weights`` on the host, one at a time, into ``pack_shared``'s flat buffers."""
    host = {
        (field_dtype, index): np.empty(size, field_dtype[1])
        for field_dtype, chunks in sizes.items()
        for index, size in enumerate(chunks)
    }
    for weight, places in zip(weights, placed, strict=True):
        packed = PackedQuantizedWeight.pack(weight, np)
        for field, place in zip(PACKED_FIELDS, places, strict=True):
            if place is not None:
                field_dtype, index, offset = place
                part = getattr(packed, field).reshape(-1)
                host[field_dtype, index][offset : offset + part.size] = part
        del packed
    return host


def pack_shared(weights: list[QuantizedWeight]) -> list[PackedQuantizedWeight]:
    """``[PackedQuantizedWeight.pack(w) for w in weights]``, with the weights' codes, scales and
    mins in flat buffers shared by all of them (per field and dtype: int8 codes, int4 lanes,
    scales, mins; a new buffer every ``SHARED_BUFFER_ELEMENTS``); each weight keeps its place as
    ``offsets``.

    Computes the same products. A step then passes a few arrays for a whole model's kernels
    instead of two or three per kernel: on CPU every argument of a jitted call costs dispatch
    time (``jaxgen.engine.step.flat_params.FlatParams`` passes a shared array once). The weights are
    packed one at a time on the host (numpy: no per-weight dispatch or compile) into host
    buffers, which then go to the device once each, so besides ``weights`` and the buffers only
    one packed weight exists at a time."""
    fields = PACKED_FIELDS
    layouts = [_packed_layout(weight) for weight in weights]
    sizes: dict[tuple, list[int]] = {}  # (field, dtype) -> elements in each of its buffers
    placed = []  # per weight and field: (key, buffer index, offset) or None
    for layout in layouts:
        places = []
        for field in fields:
            leaf = getattr(layout, field)
            if leaf is None:
                places.append(None)
                continue
            chunks = sizes.setdefault((field, np.dtype(leaf.dtype)), [0])
            if chunks[-1] and chunks[-1] + leaf.size > SHARED_BUFFER_ELEMENTS:
                chunks.append(0)
            places.append(((field, np.dtype(leaf.dtype)), len(chunks) - 1, chunks[-1]))
            chunks[-1] += leaf.size
        placed.append(places)
    host = _shared_host_buffers(weights, placed, sizes)
    buffers = {}
    for place in list(host):
        # One host buffer at a time. A buffer read from the cache (a read-only memory map,
        # 64-byte aligned) becomes a device array without a copy on the CPU; jnp.asarray
        # copied it (~0.1 s for the default model).
        buffers[place] = jax.device_put(host.pop(place))

    def shared(place):
        return None if place is None else buffers[place[0], place[1]]

    return [
        dataclasses.replace(
            layout,
            values=shared(places[0]),
            scales=shared(places[1]),
            mins=shared(places[2]),
            scale_codes=shared(places[3]),
            min_codes=shared(places[4]),
            offsets=tuple(0 if place is None else place[2] for place in places),
        )
        for layout, places in zip(layouts, placed, strict=True)
    ]
