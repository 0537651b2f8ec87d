"""Engine knobs, named as users of TGI, DJL/SageMaker LMI and vLLM know them; validated here."""

from __future__ import annotations

import dataclasses

from jaxgen.backends import BACKENDS
from jaxgen.quantization import QUANTIZATION_CHOICES
from jaxgen.quantization.kv_cache import KV_CACHE_DTYPES

BATCHING_MODES = ("none", "static", "dynamic", "continuous", "paged")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine batches and how much KV memory it may take.

    Args:
        batching: "none", "static", "dynamic", "continuous" or "paged" (default).
        max_rolling_batch_size: most sequences running at once (continuous/paged).
        max_rolling_batch_prefill_tokens: token budget of one step (prefill chunks + decodes).
        batch_size: batch size of static/dynamic batching.
        max_batch_delay: seconds dynamic batching waits to fill a batch.
        page_size: tokens per KV page.
        max_model_len: longest sequence (prompt + output); None: min(model's context, 2048).
        kv_cache_memory: KV pool size: bytes (int), a fraction of free device memory (float in
            (0, 1]), or None for the default (2 GiB on CPU, 0.9 of free memory elsewhere).
        attention_backend: "reference" (pure JAX), "pallas-tpu", "pallas-gpu", "pallas" (the
            platform's Pallas kernels), "cpu" (native kernels, CPU float32) or "auto" (pallas-tpu
            on TPU, pallas-gpu on GPU, cpu where it builds, else reference).
        enable_prefix_caching: reuse full prompt pages between requests (paged only).
        seed: base seed for requests that set none.
        tensor_parallel_degree: devices one model copy is sharded over (the mesh's "model" axis).
        data_parallel_size: engine replicas on disjoint device groups, behind one front door.
        precompile: compile the step for every batch shape when the engine starts (greedy
            sampling; see ``LLMEngine.precompile``), so no request waits on a compile later.
        quantization: weights as loaded: "auto" (default: a GGUF keeps its Q8_0/Q4_0/Q4_1
            types, a float checkpoint stays float), "none" (dequantise to ``dtype``), or
            "int8" / "int4" / "fp8" (quantise a float checkpoint at load); see
            ``jaxgen.quantization``.
        kv_cache_dtype: the KV pool's values: "auto" (the model dtype), "int8" or "fp8" (e4m3),
            8-bit with a float32 scale per token and KV head (reference and cpu backends).
    """

    batching: str = "paged"
    max_rolling_batch_size: int = 64
    max_rolling_batch_prefill_tokens: int = 512
    batch_size: int = 4
    max_batch_delay: float = 0.1
    page_size: int = 16
    max_model_len: int | None = None
    kv_cache_memory: int | float | None = None
    attention_backend: str = "auto"
    enable_prefix_caching: bool = True
    seed: int = 0
    tensor_parallel_degree: int = 1
    data_parallel_size: int = 1
    precompile: bool = False
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        def check(ok, name, what):
            if not ok:
                raise ValueError(f"{name} {what}, got {getattr(self, name)!r}")

        check(self.batching in BATCHING_MODES, "batching", f"must be one of {BATCHING_MODES}")
        check(
            _int(self.max_rolling_batch_size) and self.max_rolling_batch_size >= 1,
            "max_rolling_batch_size",
            "must be an integer >= 1",
        )
        check(
            _int(self.max_rolling_batch_prefill_tokens)
            and self.max_rolling_batch_prefill_tokens >= 16,
            "max_rolling_batch_prefill_tokens",
            "must be an integer >= 16",
        )
        check(
            _int(self.batch_size) and self.batch_size >= 1, "batch_size", "must be an integer >= 1"
        )
        check(
            isinstance(self.max_batch_delay, (int, float)) and self.max_batch_delay >= 0,
            "max_batch_delay",
            "must be a number of seconds >= 0",
        )
        check(
            _int(self.page_size)
            and self.page_size >= 1
            and self.page_size & (self.page_size - 1) == 0,
            "page_size",
            "must be a power of two",
        )
        check(
            self.max_model_len is None or (_int(self.max_model_len) and self.max_model_len >= 2),
            "max_model_len",
            "must be an integer >= 2",
        )
        kv = self.kv_cache_memory
        check(
            kv is None or (_int(kv) and kv > 0) or (isinstance(kv, float) and 0 < kv <= 1),
            "kv_cache_memory",
            "must be bytes (int > 0) or a fraction of free memory in (0, 1]",
        )
        check(
            _int(self.tensor_parallel_degree) and self.tensor_parallel_degree >= 1,
            "tensor_parallel_degree",
            "must be an integer >= 1",
        )
        check(
            _int(self.data_parallel_size) and self.data_parallel_size >= 1,
            "data_parallel_size",
            "must be an integer >= 1",
        )
        check(isinstance(self.precompile, bool), "precompile", "must be True or False")
        check(
            self.quantization in QUANTIZATION_CHOICES,
            "quantization",
            f"must be one of {', '.join(repr(name) for name in QUANTIZATION_CHOICES)}",
        )
        check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            "kv_cache_dtype",
            f"must be one of {', '.join(repr(name) for name in KV_CACHE_DTYPES)}",
        )
        check(
            self.attention_backend in BACKENDS,
            "attention_backend",
            f"must be one of {', '.join(repr(name) for name in BACKENDS)}",
        )

    @property
    def num_slots(self) -> int:
        """Concurrent sequences the strategy runs."""
        if self.batching == "none":
            return 1
        if self.batching in ("static", "dynamic"):
            return self.batch_size
        return self.max_rolling_batch_size


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
