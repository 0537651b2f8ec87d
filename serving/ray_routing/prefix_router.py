"""``PrefixRouter``: Ray Serve's request router for the engine replicas, prefix-cache aware.

Configured on the engine deployment with ``RequestRouterConfig(request_router_class=
PrefixRouter, request_router_kwargs={...})``; Ray makes one in every process that holds a handle
to the deployment (here: each ingress replica). Each routed call's first argument is a
``ForwardedRequest`` whose ``routing`` text the policy matches (``PrefixPolicy``). A replica's
load is the larger of the requests this router has in flight there and Ray's cached queue length
for it. When Ray's replica set changes, or a replica's actor dies, the replicas gone are
forgotten (their prefixes and in-flight counts).
"""

from __future__ import annotations

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from serving.ray_routing.prefix_policy import PrefixPolicy
from serving.ray_routing.routing_text import RoutingText


def request_routing(pending_request: PendingRequest | None) -> RoutingText:
    """The routing text of a routed call (empty for one that carries none)."""
    if pending_request is None or not pending_request.args:
        return RoutingText()
    routing = getattr(pending_request.args[0], "routing", None)
    return routing if isinstance(routing, RoutingText) else RoutingText()


class PrefixRouter(RequestRouter):
    """Routes a request to the replica holding the longest prefix of its prompt.

    ``request_router_kwargs``: ``imbalanced_threshold``, ``match_rate_threshold`` and
    ``max_chars_per_replica`` (``PrefixPolicy``'s arguments).
    """

    def initialize_state(
        self,
        imbalanced_threshold: float = 8,
        match_rate_threshold: float = 0.5,
        max_chars_per_replica: int = 1 << 20,
    ) -> None:
        self.policy = PrefixPolicy(
            imbalanced_threshold=imbalanced_threshold,
            match_rate_threshold=match_rate_threshold,
            max_chars_per_replica=max_chars_per_replica,
        )

    def replica_load(self, replica: RunningReplica) -> int:
        queued = self.replica_queue_len_cache.get(replica.replica_id)
        own = self.policy.load(replica.replica_id.unique_id)
        return own if queued is None else max(own, queued)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        loads = {key: self.replica_load(replica) for key, replica in by_id.items()}
        routing = request_routing(pending_request)
        ranks = self.policy.rank(routing.text, loads, history=routing.history)
        return [[by_id[key] for key in rank] for rank in ranks]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        self.policy.routed(
            request_routing(pending_request).text,
            replica_id.unique_id,
            pending_request.metadata.internal_request_id,
        )

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self.policy.completed(replica_id.unique_id, internal_request_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.policy.keep_only(replica.replica_id.unique_id for replica in replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.drop(replica_id.unique_id)
