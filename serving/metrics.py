"""Prometheus metrics: engine gauges read at scrape time plus per-request histograms.

Each app has its own ``CollectorRegistry``, so several apps in one process do not clash.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Seconds: 5 ms to 5 s in steps of 1, 2.5 and 5, which both latency scales share.
ONE_TWO_FIVE = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LATENCY_BUCKETS = (*ONE_TWO_FIVE, 10.0, 30.0, 60.0, 120.0, 300.0)  # from a request's arrival
TOKEN_LATENCY_BUCKETS = tuple(sorted((0.001, 0.0025, 0.075, *ONE_TWO_FIVE)))  # between tokens
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class EngineStatsCollector:
    """Exposes ``llm.stats()`` (read when scraped) as gauges and counters."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.stats = stats

    def describe(self):
        return []

    def collect(self):
        stats = self.stats() or {}
        gauges = (
            ("jaxgen_num_requests_running", "Requests the engine is running.", "num_running"),
            ("jaxgen_num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting"),
            ("jaxgen_kv_cache_usage_ratio", "Fraction of KV pages in use.", "kv_cache_usage"),
            ("jaxgen_kv_pages_used", "KV pages referenced by requests.", "kv_pages_used"),
            ("jaxgen_kv_pages_total", "Usable KV pages in the pool.", "kv_pages_total"),
            (
                "jaxgen_precompile_compiles",
                "XLA compilations the engine ran before it was ready.",
                "precompile_compiles",
            ),
            ("jaxgen_precompile_seconds", "Seconds the engine spent precompiling.", "precompile_s"),
            ("jaxgen_host_kv_pages", "KV pages held in the host tier.", "host_kv_pages"),
        )
        for name, documentation, key in gauges:
            yield GaugeMetricFamily(name, documentation, value=float(stats.get(key, 0)))
        counters = (
            ("jaxgen_num_preemptions", "Sequences preempted for lack of KV pages.", "preemptions"),
            ("jaxgen_prompt_tokens", "Prompt tokens admitted.", "prompt_tokens_total"),
            ("jaxgen_generation_tokens", "Tokens generated.", "generation_tokens_total"),
            ("jaxgen_engine_steps", "Engine steps run.", "steps"),
            ("jaxgen_engine_failed_steps", "Engine steps that raised.", "failed_steps"),
            (
                "jaxgen_prefix_cache_hit_pages",
                "Prompt KV pages reused from the prefix cache.",
                "prefix_cache_hit_pages",
            ),
            (
                "jaxgen_host_kv_hit_pages",
                "Prefix-hit KV pages copied back from the host tier.",
                "host_kv_hit_pages",
            ),
            (
                "jaxgen_kv_offloaded_bytes",
                "KV bytes copied from the device pool to the host tier.",
                "kv_offloaded_bytes",
            ),
            (
                "jaxgen_kv_onloaded_bytes",
                "KV bytes copied from the host tier to the device pool.",
                "kv_onloaded_bytes",
            ),
            (
                "jaxgen_compiles",
                "XLA compilations in this process (precompiling included); none after ready.",
                "compiles",
            ),
        )
        for name, documentation, key in counters:
            yield CounterMetricFamily(name, documentation, value=float(stats.get(key, 0)))
        if "spec_decode_num_drafts" in stats:  # vLLM's spec-decode counters, jaxgen_-prefixed
            yield from _spec_decode_metrics(stats)


def _spec_decode_metrics(stats: dict):
    counters = (
        ("jaxgen_spec_decode_num_drafts", "Drafts verified.", "spec_decode_num_drafts"),
        (
            "jaxgen_spec_decode_num_draft_tokens",
            "Draft tokens verified.",
            "spec_decode_num_draft_tokens",
        ),
        (
            "jaxgen_spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            "spec_decode_num_accepted_tokens",
        ),
    )
    for name, documentation, key in counters:
        yield CounterMetricFamily(name, documentation, value=float(stats[key]))
    per_position = CounterMetricFamily(
        "jaxgen_spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted, by their position in the draft.",
        labels=["position"],
    )
    for position, count in enumerate(stats["spec_decode_num_accepted_tokens_per_pos"]):
        per_position.add_metric([str(position)], float(count))
    yield per_position


class ConstantLabels:
    """A registry's metrics with the same labels added to every sample (e.g. a replica's id, so
    a scraper that merges replicas can tell them apart)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry = registry
        self.labels = dict(labels)

    def collect(self):
        for family in self.registry.collect():
            samples = [
                sample._replace(labels={**self.labels, **sample.labels})
                for sample in family.samples
            ]
            family.samples = samples
            yield family


class ServerMetrics:
    """The app's registry and the metrics the routes update; ``labels`` are added to every
    sample when rendered."""

    def __init__(self, labels: dict[str, str] | None = None):
        self.labels = dict(labels or {})
        self.registry = CollectorRegistry()
        self.stats_source: Callable[[], dict | None] = lambda: None
        self.registry.register(EngineStatsCollector(lambda: self.stats_source()))
        registry = self.registry
        self.success = Counter(
            "jaxgen_request_success",
            "Finished requests by finish reason.",
            ["finish_reason"],
            registry=registry,
        )
        self.failed = Counter(
            "jaxgen_request_failure", "Accepted requests the engine failed.", registry=registry
        )
        self.rejected = Counter(
            "jaxgen_request_rejected",
            "Requests refused before generation, by reason.",
            ["reason"],
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "jaxgen_time_to_first_token_seconds",
            "Arrival to first generated token.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.time_per_output_token = Histogram(
            "jaxgen_time_per_output_token_seconds",
            "Mean time between generated tokens.",
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=registry,
        )
        self.e2e_latency = Histogram(
            "jaxgen_e2e_request_latency_seconds",
            "Arrival to finish.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "jaxgen_request_queue_time_seconds",
            "Arrival to first scheduled.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "jaxgen_batch_size",
            "Sequences per engine step.",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )

    def render(self) -> bytes:
        if self.labels:
            return generate_latest(ConstantLabels(self.registry, self.labels))
        return generate_latest(self.registry)

    def observe_finished(
        self, metrics: dict | None, finish_reason: str | None, num_generated: int
    ) -> None:
        """Records one finished request from its ``RequestOutput.metrics``."""
        self.success.labels(finish_reason=finish_reason or "unknown").inc()
        if not metrics or finish_reason == "abort":
            return
        arrival = metrics.get("arrival_time")
        scheduled = metrics.get("first_scheduled_time")
        first_token = metrics.get("first_token_time")
        finish = metrics.get("finish_time")
        if arrival is None:
            return
        if scheduled is not None:
            self.queue_time.observe(max(scheduled - arrival, 0.0))
        if first_token is not None:
            self.time_to_first_token.observe(max(first_token - arrival, 0.0))
        if finish is not None:
            self.e2e_latency.observe(max(finish - arrival, 0.0))
            if first_token is not None and num_generated > 1:
                per_token = (finish - first_token) / (num_generated - 1)
                self.time_per_output_token.observe(max(per_token, 0.0))


def watch_engine_steps(llm, callback: Callable[[int], None]) -> Callable[[], None]:
    """Calls ``callback(batch_size)`` after each engine step that ran (a step observer of
    ``llm``'s engine, ``jaxgen.engine.step_observers``); returns the unsubscriber. An engine
    without observers (a wrapper) is not watched."""
    observers = getattr(getattr(llm, "engine", None), "observers", None)
    if observers is None:
        return lambda: None
    return observers.add(lambda event: callback(event.batch_size))
