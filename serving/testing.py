"""Test support: one ``AsyncLLM`` per process (engines are slow to build) and in-thread servers."""

from __future__ import annotations

import atexit
import threading

from jaxgen.async_llm import AsyncLLM
from serving.launch.server import ServerThread, free_port

_LLMS: dict[tuple, object] = {}
_LOCK = threading.Lock()


def shared_llm(model: str, **knobs):
    """An ``AsyncLLM`` for ``model`` and ``knobs``, built once per process and reused."""
    key = (model, tuple(sorted(knobs.items())))
    with _LOCK:
        llm = _LLMS.get(key)
        if llm is None:
            llm = _LLMS[key] = AsyncLLM(model=model, **knobs)
            atexit.register(llm.shutdown)
    return llm


# Engine knobs the server tests share (a small KV pool keeps CPU steps fast).
TINY_ENGINE_KNOBS = dict(
    max_model_len=256,
    kv_cache_memory=4 << 20,
    max_rolling_batch_size=16,
    max_rolling_batch_prefill_tokens=256,
)

__all__ = ["TINY_ENGINE_KNOBS", "ServerThread", "free_port", "shared_llm"]
