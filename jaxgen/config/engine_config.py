"""Engine knobs, named as users of TGI, DJL/SageMaker LMI and vLLM know them; validated here.

Each field is declared once, with a ``Knob``: its flag, help text and the names ``jaxgen serve``
reads it under. The ``generate``/``bench``/``serve`` command lines, the server's environment
variables and ``serving.properties`` keys, and the table in docs/configuration.md are derived
from these declarations (``jaxgen/config/knobs.py``). Adding a knob is adding one field here.
"""

from __future__ import annotations

import dataclasses

from jaxgen.config.knob_declaration import knob
from jaxgen.quantization import QUANTIZATION_CHOICES
from jaxgen.quantization.kv_cache import KV_CACHE_DTYPES

BATCHING_MODES = ("none", "static", "dynamic", "continuous", "paged")
SAMPLER_EXECUTABLES = ("auto", "shared", "per-batch")
SCHEDULING_POLICIES = ("fcfs", "priority")  # jaxgen.engine.scheduling.policy.POLICIES
TASKS = ("auto", "generate", "embed", "classify", "score")
BACKENDS = ("auto", "reference", "pallas-tpu", "pallas-gpu", "cpu", "pallas")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine batches and how much KV memory it may take (see each field's ``Knob``)."""

    task: str = knob(
        "auto",
        help="what the model runs for (vLLM's --task): generate, embed (pooled embeddings, "
        "no KV pool), classify (a sequence classifier's labels), score (embed or classify, as "
        "the model allows) or auto (a decoder generates; an encoder embeds, or classifies when "
        "it has a classifier head)",
        serve_only=True,
        choices=TASKS,
    )
    batching: str = knob(
        "paged",
        help="none, static, dynamic, continuous (contiguous KV per slot) or paged",
        choices=BATCHING_MODES,
    )
    max_rolling_batch_size: int = knob(
        64,
        help="most sequences running at once (continuous, paged)",
        env=("MAX_BATCH_SIZE",),
        properties=("option.max_rolling_batch_size",),
    )
    max_rolling_batch_prefill_tokens: int = knob(
        512,
        help="token budget of one step: prefill chunks and decodes; longer prompts are "
        "prefilled in chunks",
        env=("MAX_BATCH_PREFILL_TOKENS",),
        properties=("option.max_rolling_batch_prefill_tokens",),
    )
    batch_size: int = knob(
        4,
        help="batch size of static and dynamic batching",
        properties=("batch_size", "option.batch_size"),
    )
    max_batch_delay: float = knob(
        0.1,
        help="seconds dynamic batching waits to fill a batch",
        default_text="0.1 (s)",
    )
    scheduling_policy: str = knob(
        "fcfs",
        help="fcfs (first come, first served) or priority: requests go by their priority (an "
        "int, lower first; default 0), then arrival, and a waiting request preempts a running "
        "one of a lower priority for its slot or KV pages (recomputed later); under fcfs a "
        "non-zero priority is refused",
        choices=SCHEDULING_POLICIES,
        env=("SCHEDULING_POLICY",),
        properties=("option.scheduling_policy",),
    )
    page_size: int = knob(
        16,
        help="tokens per KV page (a power of two)",
    )
    max_model_len: int | None = knob(
        None,
        help="longest sequence, prompt + output",
        default_text="`None`: min(model's `max_position_embeddings`, 2048)",
        properties=("option.max_model_len",),
    )
    kv_cache_memory: int | float | None = knob(
        None,
        help="KV pool size: bytes (an int; flags also take 64MiB, 2GiB) or a fraction in (0, 1] "
        "of the device memory free once the weights are loaded (on CPU: of the 2 GiB default)",
        default_text="`None`: 0.9 of free accelerator memory; on CPU 2 GiB or, if less, every "
        "sequence at `max_model_len`",
    )
    attention_backend: str = knob(
        "auto",
        help="reference (pure JAX), pallas-tpu (Mosaic ragged kernel, docs/tpu.md), pallas-gpu "
        "(Triton split-KV decode + ragged prefill kernels, docs/gpu.md; a CUDA GPU, or "
        "interpreted on CPU), pallas (the platform's Pallas kernels; interpret mode "
        "on CPU), cpu (native C++ kernels through the XLA FFI: paged decode attention and the "
        "projections' matmuls over panel-packed weights; CPU, float32; under tensor parallelism "
        "the attention per device, XLA's matmuls) or "
        "auto (pallas-tpu on TPU; pallas-gpu on a GPU of compute capability 8.0 and up, reference "
        "below it, where Triton does not compile; cpu on CPU where it builds, else reference)",
        choices=BACKENDS,
    )
    attention_kernel_options: dict | None = knob(
        None,
        help="pallas-gpu only: the GPU attention kernels' tuning arguments and the backend's "
        'options (JSON on the command line), e.g. {"num_splits": 16}, {"pallas_merge": true} '
        'or {"xla_gemm": "cublas"}; their names, meanings and measured defaults in docs/gpu.md',
        default_text="`None`: the kernels' defaults",
    )
    sampler_executables: str = knob(
        "auto",
        help="shared (one sampler and one step executable per shape serve every request: a "
        "stage no row needs, such as penalties, logprobs, logit bias, grammar masks or prompt "
        "logprobs, is skipped at run time), per-batch (the host leaves out of each batch's "
        "executables the stages none of its rows needs, and XLA's run-time checks with them: "
        "fewer stages to compile for a run of a few known requests, one more executable for "
        "each new combination) or auto (per-batch on a GPU, where XLA runs those checks on "
        "the host and the host would wait for the device every step; shared elsewhere)",
        choices=SAMPLER_EXECUTABLES,
    )
    enable_prefix_caching: bool = knob(
        True,
        help="reuse full prompt pages across requests (paged only)",
        flag="--no-prefix-caching",
        properties=("option.enable_prefix_caching",),
    )
    batch_invariant: bool = knob(
        False,
        help="a sequence's greedy tokens and logprobs bitwise the same whether it runs alone or "
        "in any batch, with chunked prefill or a prefix-cache hit: the matmuls in fixed row "
        "chunks and every row's attention over a fixed key axis (reference and cpu backends, "
        "float32 / bfloat16 weights; costs speed, docs/api.md)",
    )
    seed: int = knob(
        0,
        help="base seed for requests that set none (each unseeded row gets a fresh seed per step)",
        serve_only=True,
        minimum=0,
    )
    tensor_parallel_degree: int = knob(
        1,
        help="devices one model copy is sharded over; must divide the query heads",
        serve_only=True,
        env=("NUM_SHARD", "SM_NUM_GPUS"),
        properties=("option.tensor_parallel_degree",),
    )
    data_parallel_size: int = knob(
        1,
        help="engine replicas on disjoint device groups of one host, behind one front door",
        flag="",
    )
    async_scheduling: bool = knob(
        False,
        help="schedule and start each step before the previous one's tokens reach the host (its "
        "decode rows take them on the device), so the host's work overlaps the device's; steps "
        "whose sequences need their tokens on the host (penalties, grammars, LongRoPE) run one "
        "at a time",
    )
    num_scheduler_steps: int = knob(
        1,
        help="decode steps per call when every running sequence decodes (multi-step decoding): "
        "the device feeds each step's tokens to the next and the host reads them all at once, "
        "so the host's per-step work is paid once per call; stops are checked afterwards (the "
        "tokens after a stop are dropped); new requests are admitted between calls; steps "
        "whose sequences need their tokens on the host (penalties, grammars, LongRoPE, "
        "min_tokens) or lack the room run one at a time",
    )
    speculative_config: dict | None = knob(
        None,
        help='speculative decoding, vLLM\'s dict (JSON on the command line): method "ngram" '
        '(prompt lookup; prompt_lookup_min/max) or "draft_model" (model: a checkpoint with the '
        "target's vocabulary, drafting greedily in a second engine; quantization: its weights, "
        "e.g. int4 of the target's own checkpoint; a model without method means it), "
        "num_speculative_tokens (1-16); greedy and sampled rows speculate (rejection sampling), "
        "rows with structured output too (drafts cut to the grammar, each position under its "
        "mask); not with num_scheduler_steps > 1; with async_scheduling a step that may carry "
        "drafts runs synchronously",
    )
    kv_offloading_size: int | None = knob(
        None,
        help="bytes of host memory for a second KV tier (vLLM's name): full prefix-cache pages "
        "evicted from the device pool are copied there, and a prefix hit on one is copied back "
        "before its sequence's step; LRU; paged batching only",
        properties=("option.kv_offloading_size",),
        minimum=0,
    )
    kv_events_config: dict | None = knob(
        None,
        help="publish the prefix cache's changes (page stored with its hash, parent hash and "
        "tokens; removed; all cleared) as vLLM's KV events, JSON with vLLM's fields: "
        'enable_kv_cache_events, publisher ("zmq" or "null"), endpoint (tcp://*:5557), '
        "replay_endpoint, buffer_steps, hwm, max_queue_size, topic; replica N of "
        "data_parallel_size adds N to the ports",
    )
    enable_lora: bool = knob(
        False,
        help="serve PEFT LoRA adapters (a LoRARequest per request): max_loras device slots of "
        "max_lora_rank, adapters of one step mixed per row, none recompiling",
    )
    max_loras: int = knob(1, help="LoRA adapters that may run in one step (device slots)")
    max_lora_rank: int = knob(16, help="the largest LoRA rank an adapter may have")
    max_cpu_loras: int | None = knob(
        None, help="LoRA adapters kept read on the host (LRU); default: max_loras", minimum=1
    )
    precompile: bool = knob(
        False,
        help="compile the step for every batch shape when the engine starts, so no request waits "
        "on a compile later (jaxgen serve and jaxgen bench: on unless turned off)",
        flag="--no-precompile",
        serve_only=True,
        properties=("option.precompile",),
    )
    quantization: str = knob(
        "auto",
        help="weights as loaded: auto (a GGUF keeps its Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q2_K-Q6_K/"
        "IQ4_XS types exactly, a float checkpoint stays float), none (dequantise to --dtype), or int8 / int4 / fp8 quantised at load "
        "(int8: integer CPU kernels may take x as 16-bit codes); w8a8: int8 weights whose "
        "matmuls quantise their input to int8 too, per row and 32 columns "
        "(jaxgen.quantization); w4a8: int4 weights whose matmuls do the same, llama.cpp's "
        "CPU numbers (a GGUF keeps its types; a float checkpoint is quantised to int4); TGI's "
        "eetq and bitsandbytes mean int8",
        choices=QUANTIZATION_CHOICES,
        env=("QUANTIZE",),
        properties=("option.quantize",),
    )
    compile_cache: bool = knob(
        True,
        help="keep compiled executables on disk, in $JAXGEN_CACHE_DIR/xla, so a second run "
        "compiles nothing (jaxgen.caches.compile_cache; JAXGEN_COMPILE_CACHE=0 turns it off too)",
        flag="--no-compile-cache",
    )
    kv_cache_dtype: str = knob(
        "auto",
        help="KV pool values: auto (the model dtype), int8 or fp8 (e4m3): 8-bit with bfloat16 "
        "scales per token, KV head and 32 head_dim elements (every backend; pallas-tpu: page_size a multiple of 128)",
        choices=KV_CACHE_DTYPES,
        properties=("option.kv_cache_dtype",),
    )

    def __post_init__(self):
        def check(ok, name, what):
            if not ok:
                raise ValueError(f"{name} {what}, got {getattr(self, name)!r}")

        for field in dataclasses.fields(self):  # task, batching, quantization, ...
            choices = getattr(field.metadata.get("knob"), "choices", None)
            if choices is not None:
                shown = ", ".join(repr(name) for name in choices)
                check(getattr(self, field.name) in choices, field.name, f"must be one of {shown}")
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
        check(isinstance(self.enable_lora, bool), "enable_lora", "must be True or False")
        for name in ("max_loras", "max_lora_rank"):
            check(_int(getattr(self, name)) and getattr(self, name) >= 1, name, "must be >= 1")
        cpu_loras = self.max_cpu_loras
        check(cpu_loras is None or (_int(cpu_loras) and cpu_loras >= 1), "max_cpu_loras", ">= 1")
        check(isinstance(self.compile_cache, bool), "compile_cache", "must be True or False")
        check(isinstance(self.async_scheduling, bool), "async_scheduling", "must be True or False")
        check(
            _int(self.num_scheduler_steps) and self.num_scheduler_steps >= 1,
            "num_scheduler_steps",
            "must be an integer >= 1",
        )
        check(
            self.num_scheduler_steps == 1 or not self.async_scheduling,
            "num_scheduler_steps",
            "must be 1 with async_scheduling (each hides the host's per-step work its own way)",
        )
        size = self.kv_offloading_size
        check(
            size is None or (_int(size) and size >= 0), "kv_offloading_size", "must be bytes >= 0"
        )
        if self.kv_events_config is not None:
            from jaxgen.config.kv_events_config import KVEventsConfig

            KVEventsConfig.from_dict(self.kv_events_config)  # names the key
        if self.speculative_config is not None:
            from jaxgen.config.speculative_config import SpeculativeConfig

            speculative = SpeculativeConfig.from_dict(self.speculative_config)  # names the key
            if speculative.method == "draft_model" and (
                self.tensor_parallel_degree > 1 or self.data_parallel_size > 1
            ):
                raise ValueError(
                    "speculative_config.model: a draft model runs with tensor_parallel_degree 1 "
                    "and data_parallel_size 1"
                )
            check(
                self.num_scheduler_steps == 1,
                "speculative_config",
                "needs num_scheduler_steps 1 (a draft is verified by the step after it)",
            )
        check(
            self.attention_kernel_options is None
            or (
                isinstance(self.attention_kernel_options, dict)
                and all(isinstance(name, str) for name in self.attention_kernel_options)
            ),
            "attention_kernel_options",
            "must be a dict of kernel argument names to values, or None",
        )


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
