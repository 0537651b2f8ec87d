"""Pallas kernels for NVIDIA GPUs (the Triton lowering), one folder per kernel:
``ragged_paged_attention/``. (Nothing is re-exported here, so that a kernel's folder is never
shadowed by its function's name; ``pallas_kernels`` re-exports the entry points.)"""
