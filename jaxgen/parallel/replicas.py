"""Engine replicas (data parallelism) behind one front door (the factory that picks them is
``jaxgen.create_engine``).

``data_parallel_size`` copies of the model run on disjoint device groups of one host, each its own
``LLMEngine`` on a ("data"=1, "model"=tp) sub-mesh. A new request goes to the replica with the
fewest outstanding tokens (prompt + max_tokens of its unfinished requests); one ``step()`` steps
every busy replica, on worker threads so their device work overlaps.
"""

from __future__ import annotations

import concurrent.futures

from jaxgen.engine.engine_interface import Engine
from jaxgen.engine.errors import StepFailed
from jaxgen.engine.llm_engine import LLMEngine
from jaxgen.engine.scheduling.new_request import NewRequest, takes_request_fields
from jaxgen.engine.weights import require_idle
from jaxgen.outputs import RequestOutput

# stats() keys that are per-engine settings (taken from replica 0) or process-wide, not summed.
# (One grammar compiler serves every replica: its compile time is process-wide.)
_SHARED_STATS = (
    "batching",
    "lora_adapters",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_device",
    "page_size",
    "max_model_len",
    "compiles",
    "compile_cache_hits",
    "grammar_compile_s",
    "is_sleeping",
    "sleep_level",
)


class ReplicatedEngine(Engine):
    """Several ``LLMEngine``s behind the engine interface ``LLM`` and ``AsyncLLM`` drive."""

    def __init__(self, engines: list[LLMEngine]):
        if not engines:
            raise ValueError("ReplicatedEngine needs at least one engine")
        self.engines = engines
        first = engines[0]
        self.config, self.tokenizer = first.config, first.tokenizer
        self.max_model_len = first.max_model_len
        self.kv_bytes_per_token = first.kv_bytes_per_token
        self.outstanding_tokens = [0] * len(engines)  # per replica, unfinished requests only
        self.requests_routed = [0] * len(engines)
        self._route: dict[str, tuple[int, int]] = {}  # request_id -> (replica, cost)
        self._pool = concurrent.futures.ThreadPoolExecutor(len(engines), "jaxgen-replica")
        self.num_steps = 0
        self.last_batch_size = 0

    @property
    def loaded(self):
        """Replica 0's model (its weights as they are now)."""
        return self.engines[0].loaded

    @property
    def batching(self):
        """What the batching mode means (the same for every replica)."""
        return self.engines[0].batching

    @property
    def params(self):
        """Replica 0's parameters (each replica holds its own copy)."""
        return self.engines[0].params

    @property
    def runner(self):
        """Replica 0's runner (``jaxgen bench`` times its device steps)."""
        return self.engines[0].runner

    @property
    def lora(self):
        """Replica 0's LoRA bookkeeping (its ``read`` checks an adapter for any replica)."""
        return self.engines[0].lora

    def add_lora(self, lora_request, adapter=None):
        """Every replica knows the adapter (``LLMEngine.add_lora``)."""
        return [engine.add_lora(lora_request, adapter) for engine in self.engines][0]

    def remove_lora(self, lora_int_id: int) -> None:
        """Every replica forgets it; ``ValueError`` (before any does) when one uses it."""
        for engine in self.engines:
            if any(
                seq.lora_int_id == lora_int_id for r in engine.requests.values() for seq in r.seqs
            ):
                raise ValueError(f"LoRA adapter {lora_int_id} is in use by running requests")
        for engine in self.engines:
            engine.remove_lora(lora_int_id)

    def list_loras(self) -> list:
        return self.engines[0].list_loras()

    def reset_prefix_cache(self) -> None:
        for engine in self.engines:
            engine.reset_prefix_cache()

    # -- weights and sleep mode: every replica alike ----------------------------------------------
    def update_weights(self, params) -> None:
        """Every replica runs on ``params``, each placed on its own devices (replica 0 checks
        them first: a mismatch swaps none)."""
        require_idle(self, "update_weights")
        for engine in self.engines:
            engine.update_weights(params)

    def sleep(self, level: int = 1) -> None:
        require_idle(self, "sleep")
        for engine in self.engines:
            engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        for engine in self.engines:
            engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engines[0].is_sleeping()

    @property
    def requests(self) -> dict:
        """Unfinished requests of every replica, by id."""
        merged = {}
        for engine in self.engines:
            merged.update(engine.requests)
        return merged

    def replica_of(self, request_id: str) -> int | None:
        entry = self._route.get(request_id)
        return None if entry is None else entry[0]

    # -- requests --------------------------------------------------------------------------------
    @takes_request_fields
    def add_request(self, new: NewRequest):
        """Queues the request on the least loaded replica (by outstanding tokens)."""
        request_id, prompt_token_ids, params = new.request_id, new.prompt_token_ids, new.params
        if request_id in self._route:
            raise ValueError(f"request_id {request_id!r} is already running")
        max_tokens = params.max_tokens or max(self.max_model_len - len(prompt_token_ids), 1)
        cost = len(prompt_token_ids) + max_tokens * params.n
        index = min(
            range(len(self.engines)),
            key=lambda i: (self.outstanding_tokens[i], self.requests_routed[i], i),
        )
        request = new.add_to(self.engines[index])
        self._route[request_id] = (index, cost)
        self.outstanding_tokens[index] += cost
        self.requests_routed[index] += 1
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        entry = self._route.get(request_id)
        if entry is None:
            return None
        output = self.engines[entry[0]].abort(request_id)
        self._release(request_id)
        return output

    def _release(self, request_id: str) -> None:
        entry = self._route.pop(request_id, None)
        if entry is not None:
            self.outstanding_tokens[entry[0]] -= entry[1]

    def has_unfinished(self) -> bool:
        return any(engine.has_unfinished() for engine in self.engines)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Steps every replica with work (concurrently); returns all their outputs."""
        busy = [engine for engine in self.engines if engine.has_unfinished()]
        if not busy:
            return []
        before = [engine.num_steps for engine in busy]
        if len(busy) == 1:
            results = [_step_or_failure(busy[0])]
        else:
            results = list(self._pool.map(_step_or_failure, busy))
        stepped = [e for e, n in zip(busy, before, strict=True) if e.num_steps != n]
        if stepped:
            self.num_steps += 1
            self.last_batch_size = sum(engine.last_batch_size for engine in stepped)
        outputs = [out for result in results if isinstance(result, list) for out in result]
        for out in outputs:
            if out.finished:
                self._release(out.request_id)
        failures = [result for result in results if isinstance(result, BaseException)]
        for failure in failures:
            for request_id in getattr(failure, "request_ids", ()):
                self._release(request_id)
        dead = [f for f in failures if not isinstance(f, StepFailed)]
        if dead:  # a dead replica (or an unexpected error) is the caller's to handle
            raise dead[0]
        if failures:  # replicas that recovered: fail their step's requests, deliver the rest
            failed_ids = [i for failure in failures for i in failure.request_ids]
            raise StepFailed(failures[0].error, failed_ids, outputs=outputs)
        return outputs

    def precompile(self, sampling_params=None) -> int:
        """Precompiles every replica (each holds its own executables); returns the compiles."""
        return sum(engine.precompile(sampling_params) for engine in self.engines)

    # -- introspection ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters summed over replicas, plus ``replicas``: each replica's own stats."""
        per_replica = [engine.stats() for engine in self.engines]
        total = dict(per_replica[0])
        for key, value in total.items():
            if key not in _SHARED_STATS and isinstance(value, (int, float)):
                total[key] = sum(stats[key] for stats in per_replica)
        total["kv_cache_usage"] = total["kv_pages_used"] / max(total["kv_pages_total"], 1)
        if "spec_decode_num_drafts" in total:  # rates from the summed counters
            drafts, accepted = (
                total["spec_decode_num_drafts"],
                total["spec_decode_num_accepted_tokens"],
            )
            total["spec_decode_acceptance_rate"] = accepted / max(
                total["spec_decode_num_draft_tokens"], 1
            )
            total["spec_decode_mean_acceptance_length"] = 1 + accepted / max(drafts, 1)
            costs = [s["spec_decode_draft_token_cost"] for s in per_replica]
            costs = [cost for cost in costs if cost is not None]  # each replica's own measure
            total["spec_decode_draft_token_cost"] = sum(costs) / len(costs) if costs else None
            total["spec_decode_num_accepted_tokens_per_pos"] = [
                sum(counts)
                for counts in zip(
                    *(s["spec_decode_num_accepted_tokens_per_pos"] for s in per_replica),
                    strict=True,
                )
            ]
        total["steps"] = self.num_steps
        total["data_parallel_size"] = len(self.engines)
        total["outstanding_tokens"] = list(self.outstanding_tokens)
        total["requests_routed"] = list(self.requests_routed)
        total["replicas"] = per_replica
        return total

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self._pool.shutdown(wait=False)


def _step_or_failure(engine) -> list | BaseException:
    """One replica's step: its outputs, or what it raised (so one replica's failed step does not
    lose the outputs the others produced in the same step)."""
    try:
        return engine.step()
    except Exception as error:
        return error
