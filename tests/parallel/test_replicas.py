"""Engine replicas behind one front door: routing by outstanding tokens, stats, real replicas."""

from __future__ import annotations

import jax
import pytest

from jaxgen.engine.errors import StepFailed
from jaxgen.outputs import CompletionOutput, RequestOutput
from jaxgen.parallel.replicas import ReplicatedEngine
from jaxgen.sampling_params import SamplingParams
from tests.family_models import save_tiny_model
from tests.sharded_worker import run_worker


class FakeEngine:
    """Just enough of ``LLMEngine``: requests finish after ``steps_to_finish`` steps."""

    def __init__(self, steps_to_finish: int = 2):
        self.loaded = self.config = self.tokenizer = self.runner = None
        self.max_model_len, self.kv_bytes_per_token = 128, 64
        self.requests: dict[str, int] = {}
        self.steps_to_finish = steps_to_finish
        self.num_steps = self.last_batch_size = 0
        self.prompt_tokens_total = 0

    def add_request(
        self, request_id, prompt, prompt_token_ids, params, arrival_time=None, compiled_grammar=None
    ):
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        self.requests[request_id] = 0
        self.prompt_tokens_total += len(prompt_token_ids)

    def abort(self, request_id):
        return _output(request_id) if self.requests.pop(request_id, None) is not None else None

    def has_unfinished(self):
        return bool(self.requests)

    def step(self):
        self.num_steps += 1
        self.last_batch_size = len(self.requests)
        outputs = []
        for request_id in list(self.requests):
            self.requests[request_id] += 1
            done = self.requests[request_id] >= self.steps_to_finish
            if done:
                del self.requests[request_id]
            outputs.append(_output(request_id, done))
        return outputs

    def stats(self):
        return {
            "batching": "paged",
            "page_size": 16,
            "kv_pages_used": 1,
            "kv_pages_total": 4,
            "kv_cache_usage": 0.25,
            "num_running": len(self.requests),
            "steps": self.num_steps,
            "prompt_tokens_total": self.prompt_tokens_total,
            "compiles": 3,
        }


def _output(request_id, finished=True):
    return RequestOutput(request_id, None, [1], [CompletionOutput(0, "", [])], finished=finished)


def test_routes_to_fewest_outstanding_tokens():
    engine = ReplicatedEngine([FakeEngine(), FakeEngine()])
    engine.add_request("big", None, [1] * 50, SamplingParams(max_tokens=50))
    engine.add_request("a", None, [1] * 5, SamplingParams(max_tokens=5))
    engine.add_request("b", None, [1] * 5, SamplingParams(max_tokens=5))
    assert [engine.replica_of(r) for r in ("big", "a", "b")] == [0, 1, 1]
    assert engine.outstanding_tokens == [100, 20]
    engine.add_request("c", None, [1] * 10, SamplingParams(max_tokens=10, n=2))
    assert engine.replica_of("c") == 1 and engine.outstanding_tokens == [100, 50]


def test_finishing_and_aborting_release_tokens():
    engine = ReplicatedEngine([FakeEngine(steps_to_finish=2), FakeEngine(steps_to_finish=2)])
    for i in range(4):
        engine.add_request(f"r{i}", None, [1, 2], SamplingParams(max_tokens=3))
    assert engine.requests_routed == [2, 2]
    assert engine.abort("r0").request_id == "r0"
    assert engine.abort("unknown") is None
    assert engine.outstanding_tokens == [5, 10]
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert sorted(finished) == ["r1", "r2", "r3"]
    assert engine.outstanding_tokens == [0, 0] and engine.num_steps == 2
    assert engine.last_batch_size == 3  # one request on replica 0, two on replica 1


def test_bad_request_is_not_routed_and_duplicate_ids_fail():
    engine = ReplicatedEngine([FakeEngine(), FakeEngine()])
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("x", None, [], SamplingParams())
    assert engine.outstanding_tokens == [0, 0] and engine.replica_of("x") is None
    engine.add_request("x", None, [1], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("x", None, [1], SamplingParams(max_tokens=1))


def test_stats_sum_counts_and_list_replicas():
    engine = ReplicatedEngine([FakeEngine(), FakeEngine()])
    engine.add_request("a", None, [1, 2, 3], SamplingParams(max_tokens=4))
    engine.add_request("b", None, [1], SamplingParams(max_tokens=4))
    stats = engine.stats()
    assert stats["prompt_tokens_total"] == 4 and stats["num_running"] == 2
    assert stats["kv_pages_total"] == 8 and stats["kv_cache_usage"] == 0.25
    assert stats["page_size"] == 16 and stats["compiles"] == 3  # settings are not summed
    assert stats["data_parallel_size"] == 2 and len(stats["replicas"]) == 2
    assert stats["requests_routed"] == [1, 1]


def test_replicas_need_enough_devices(tiny_model_dir):
    from jaxgen import LLM

    if len(jax.local_devices()) >= 2:
        pytest.skip("this process has several devices")
    with pytest.raises(ValueError, match="needs 2 devices"):
        LLM(tiny_model_dir, data_parallel_size=2)


@pytest.mark.slow
def test_two_replicas_of_degree_2_match_one(tmp_path, smollm2_tokenizer):
    model = save_tiny_model(
        str(tmp_path / "gqa"), smollm2_tokenizer, num_attention_heads=8, num_key_value_heads=2
    )
    result = run_worker("replicas", {"model": model}, num_devices=4)
    assert result["tokens"] == result["expected"]
    assert result["request_ids"] == [str(i) for i in range(len(result["expected"]))]
    assert result["replica_devices"] == [[0, 1], [2, 3]]  # disjoint device groups
    assert all(s["generation_tokens_total"] > 0 for s in result["replica_stats"])  # both worked
    stats = result["stats"]
    assert stats["requests_routed"] == [3, 3] and stats["outstanding_tokens"] == [0, 0]
    assert stats["generation_tokens_total"] == 6 * len(result["expected"])
    assert result["chat_tokens"] == 6
    assert result["async_tokens"] == result["expected"]
    assert result["async_requests_routed"] == [3, 3]


class FailingEngine(FakeEngine):
    """A replica whose next step fails and recovers (``StepFailed``), failing its requests."""

    def step(self):
        failed = list(self.requests)
        self.requests.clear()
        raise StepFailed(RuntimeError("injected"), failed)


def test_a_replica_failed_step_keeps_the_other_replicas_outputs():
    engine = ReplicatedEngine([FailingEngine(), FakeEngine(steps_to_finish=1)])
    for request_id in ("a", "b"):
        engine.add_request(request_id, None, [1, 2], SamplingParams(max_tokens=1))
    with pytest.raises(StepFailed) as failure:
        engine.step()
    assert len(failure.value.request_ids) == 1 and len(failure.value.outputs) == 1
    assert {failure.value.request_ids[0], failure.value.outputs[0].request_id} == {"a", "b"}
    assert not engine.has_unfinished() and sum(engine.outstanding_tokens) == 0
