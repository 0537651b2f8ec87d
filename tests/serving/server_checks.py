"""What the server tests share: prompts, the metric names, the engine's own output to compare a
response with, waits on the engine's state, and readers of SSE streams and of ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import time

from jaxgen.sampling_params import SamplingParams

PROMPT = "The quick brown fox"
# 151 tokens: with up to 100 new tokens a sequence stays within one block-table width bucket,
# so long-running requests compile few programs.
LONG_PROMPT = "hello " * 150
METRIC_NAMES = [
    "jaxgen_num_requests_running",
    "jaxgen_num_requests_waiting",
    "jaxgen_kv_cache_usage_ratio",
    "jaxgen_num_preemptions_total",
    "jaxgen_prompt_tokens_total",
    "jaxgen_generation_tokens_total",
    "jaxgen_prefix_cache_hit_pages_total",
    "jaxgen_request_success_total",
    "jaxgen_time_to_first_token_seconds",
    "jaxgen_time_per_output_token_seconds",
    "jaxgen_e2e_request_latency_seconds",
    "jaxgen_request_queue_time_seconds",
    "jaxgen_batch_size",
]


def engine_output(llm, prompt, **params):
    """Text and token ids of the engine run directly (no server)."""

    async def run():
        last = None
        async for out in llm.generate(prompt, SamplingParams(**params), delta=False):
            last = out
        return last.outputs[0].text, last.outputs[0].token_ids

    return asyncio.run(run())


def chat_prompt_ids(llm, messages):
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def wait_idle(llm, timeout: float = 20.0) -> dict:
    """Waits until the engine runs nothing and every KV page is back in the pool."""
    deadline = time.monotonic() + timeout
    while True:
        stats = llm.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_pages_used"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle: {stats}")
        time.sleep(0.02)


def wait_running(llm, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while llm.stats()["num_running"] < count:
        assert time.monotonic() < deadline, llm.stats()
        time.sleep(0.01)


def sse_payloads(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
