"""``serving/ray_routing/prefix_router.py``: the policy behind Ray Serve's ``RequestRouter``
hooks, driven the way Ray's handle drives them, without a cluster (stand-in replicas)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray", reason="Ray Serve is the optional 'ray' extra")

from ray.serve._private.common import (  # noqa: E402 - after the skip
    DeploymentHandleSource,
    DeploymentID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest, ReplicaID  # noqa: E402

from serving.ray_routing.prefix_router import PrefixRouter  # noqa: E402
from serving.ray_routing.replica_bridge import ForwardedRequest  # noqa: E402
from serving.ray_routing.routing_text import routing_text  # noqa: E402

DEPLOYMENT = DeploymentID(name="jaxgen", app_name="jaxgen")


class StandInReplica:
    """What the router reads of a ``RunningReplica``."""

    def __init__(self, unique_id: str, queue_len: int = 0):
        self.replica_id = ReplicaID(unique_id, DEPLOYMENT)
        self.max_ongoing_requests = 8
        self.queue_len = queue_len

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def chat(turns: list[str], request_id: str) -> PendingRequest:
    roles = ["user", "assistant"] * len(turns)
    messages = [{"role": role, "content": text} for role, text in zip(roles, turns, strict=False)]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    scope = {"type": "http", "path": "/v1/chat/completions", "headers": []}
    request = ForwardedRequest.from_scope(scope, body, routing_text(scope["path"], body))
    metadata = RequestMetadata(request_id=request_id, internal_request_id=request_id)
    return PendingRequest(args=[request], kwargs={}, metadata=metadata)


def make_router(replicas) -> PrefixRouter:
    router = PrefixRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.REPLICA,
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(imbalanced_threshold=2)
    router.update_replicas(replicas)
    return router


def ids(ranks) -> list[list[str]]:
    return [[replica.replica_id.unique_id for replica in rank] for rank in ranks]


def test_turns_of_a_conversation_are_routed_where_it_began():
    async def run():
        a, b = StandInReplica("a"), StandInReplica("b")
        router = make_router([a, b])
        first = chat(["Tell me about the sea."], "r1")
        (pair,) = ids(await router.choose_replicas([a, b], first))
        chosen = router.curr_replicas[ReplicaID(pair[0], DEPLOYMENT)]
        router.on_request_routed(first, chosen.replica_id, None)
        router.on_request_completed(chosen.replica_id, "r1")
        second = chat(["Tell me about the sea.", "It is deep. " * 30, "And the sky?"], "r2")
        assert ids(await router.choose_replicas([a, b], second))[0] == [pair[0]]

    asyncio.run(run())


def test_an_overloaded_favourite_is_passed_over_by_ray_s_queue_lengths():
    async def run():
        a, b = StandInReplica("a"), StandInReplica("b")
        router = make_router([a, b])
        first = chat(["Hello"], "r1")
        router.on_request_routed(first, a.replica_id, None)
        router.replica_queue_len_cache.update(a.replica_id, 5)  # others' requests on a
        router.replica_queue_len_cache.update(b.replica_id, 0)
        later = chat(["Hello", "Hi!", "How are you?"], "r2")
        assert ids(await router.choose_replicas([a, b], later)) == [["b", "a"]]

    asyncio.run(run())


def test_a_dead_replica_and_a_replica_set_without_it_are_forgotten():
    async def run():
        a, b, c = StandInReplica("a"), StandInReplica("b"), StandInReplica("c")
        router = make_router([a, b, c])
        router.on_request_routed(chat(["one"], "r1"), a.replica_id, None)
        router.on_request_routed(chat(["two"], "r2"), b.replica_id, None)
        router.on_replica_actor_died(a.replica_id)
        assert router.policy.tree.replicas() == {"b"} and router.policy.load("a") == 0
        router.update_replicas([c])  # Ray's controller: b is gone too
        assert router.policy.tree.replicas() == set() and router.policy.load("b") == 0
        (pair,) = ids(await router.choose_replicas([c], chat(["two", "x", "y"], "r3")))
        assert pair == ["c"]

    asyncio.run(run())


def test_calls_without_a_prompt_are_placed_by_load():
    async def run():
        a, b = StandInReplica("a"), StandInReplica("b")
        router = make_router([a, b])
        router.replica_queue_len_cache.update(a.replica_id, 3)
        router.replica_queue_len_cache.update(b.replica_id, 1)
        metadata = RequestMetadata(request_id="m", internal_request_id="m")
        bare = PendingRequest(args=[], kwargs={}, metadata=metadata)
        assert ids(await router.choose_replicas([a, b], bare)) == [["b", "a"]]
        assert ids(await router.choose_replicas([a, b], None)) == [["b", "a"]]

    asyncio.run(run())
