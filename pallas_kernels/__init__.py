"""Pallas kernels, each beside its pure-JAX reference: ``gpu/`` (Triton) and ``tpu/`` (Mosaic).

The names below load on first use (PEP 562): importing a helper module of this package
(``kv_codes``, ``ragged_layout``, ``validation``) does not import Pallas and the kernels, which
a run on the native CPU backend never needs (about 0.2 s of a start-up)."""

__all__ = [
    "paged_attention_reference",
    "ragged_paged_attention_gpu",
    "ragged_paged_attention_reference",
]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'pallas_kernels' has no attribute {name!r}")
    from pallas_kernels.gpu import ragged_paged_attention as gpu_attention

    value = getattr(gpu_attention, name)
    globals()[name] = value
    return value
