"""Pallas kernels, each beside its pure-JAX reference: ``gpu/`` (Triton) and ``tpu/`` (Mosaic).

The names below load on first use (PEP 562): importing a helper module of this package
(``kv_codes``, ``ragged_layout``, ``validation``) does not import Pallas and the kernels, which
a run on the native CPU backend never needs (about 0.2 s of a start-up)."""

import importlib

_LAZY = {
    "paged_attention_reference": "pallas_kernels.gpu.ragged_paged_attention",
    "ragged_paged_attention": "pallas_kernels.gpu.ragged_paged_attention",
    "ragged_paged_attention_reference": "pallas_kernels.gpu.ragged_paged_attention",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pallas_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "paged_attention_reference",
    "ragged_paged_attention",
    "ragged_paged_attention_reference",
]
