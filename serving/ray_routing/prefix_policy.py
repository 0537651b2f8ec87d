"""Where a request goes: the replica holding the longest prefix of it, unless that one is
overloaded; then the less loaded of two random replicas (power of two choices).

``rank`` answers in Ray Serve's shape: lists of replica ids, most preferred first; Ray sends the
request to the least loaded replica of the first list that has room, trying later lists when
every replica of a list is full. The policy keeps its own count of requests in flight per replica
(``routed`` ... ``completed``); the caller may pass fresher loads (Ray's queue lengths).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from serving.ray_routing.prefix_tree import PrefixTree


class PrefixPolicy:
    """Prefix-affine replica choice with a queue-imbalance fallback.

    Args:
        imbalanced_threshold: the favoured replica is skipped when it has more than this many
            requests in flight beyond the least loaded candidate.
        match_rate_threshold: the fraction of a request's text (0 to 1) a replica must hold for
            the request to follow it (unless it holds all of the request's ``history``); below
            it the request is placed by load alone.
        max_chars_per_replica: the prefix tree's bound per replica (``PrefixTree``).
        seed: the random choices' seed (tests).
    """

    def __init__(
        self,
        *,
        imbalanced_threshold: float = 8,
        match_rate_threshold: float = 0.5,
        max_chars_per_replica: int = 1 << 20,
        seed: int | None = None,
    ):
        if imbalanced_threshold < 0:
            raise ValueError(f"imbalanced_threshold must be >= 0, got {imbalanced_threshold}")
        if not 0 <= match_rate_threshold <= 1:
            raise ValueError(
                f"match_rate_threshold must be between 0 and 1, got {match_rate_threshold}"
            )
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.tree = PrefixTree(max_chars_per_replica=max_chars_per_replica)
        self.random = random.Random(seed)
        self.in_flight: dict[str, str] = {}  # request id -> the replica it was sent to
        self.counts: dict[str, int] = {}  # replica -> requests in flight there

    def load(self, replica: str) -> int:
        """Requests this policy sent to ``replica`` that have not completed."""
        return self.counts.get(replica, 0)

    def rank(self, text: str, loads: Mapping[str, float], history: int = 0) -> list[list[str]]:
        """Ranks the candidate replicas (the keys of ``loads``, each with its requests in flight)
        for a request whose prompt is ``text`` ("" when it has none). ``history`` (if not 0):
        the length of the text an earlier turn of the same conversation sent; a replica that
        holds all of it is followed, however short a fraction of ``text`` it is."""
        if not loads:
            return []
        least = min(loads.values())
        if text:
            matched, owners = self.tree.match(text, loads)
            enough = matched >= self.match_rate_threshold * len(text) or 0 < history <= matched
            if owners and enough:
                favoured = [r for r in owners if loads[r] - least <= self.imbalanced_threshold]
                if favoured:
                    favoured.sort(key=lambda r: loads[r])
                    others = sorted(set(loads) - set(favoured), key=lambda r: self._order(r, loads))
                    return [favoured, others] if others else [favoured]
        two = self.random.sample(sorted(loads), k=min(2, len(loads)))  # in random order
        if not text:  # nothing to cache (/metrics, /health, embeddings): load, then chance
            return [sorted(two, key=lambda r: loads[r])]
        return [sorted(two, key=lambda r: self._order(r, loads))]

    def _order(self, replica: str, loads: Mapping[str, float]) -> tuple[float, int]:
        """Less loaded first; between equals, the one holding less text (new conversations
        spread over the replicas' caches)."""
        return loads[replica], self.tree.chars(replica)

    def routed(self, text: str, replica: str, request_id: str) -> None:
        """``request_id`` (prompt ``text``) was accepted by ``replica``."""
        if text:
            self.tree.insert(text, replica)
        previous = self.in_flight.get(request_id)
        if previous is not None:  # routed again (a retry): the earlier slot is released
            self.completed(previous, request_id)
        self.in_flight[request_id] = replica
        self.counts[replica] = self.counts.get(replica, 0) + 1

    def completed(self, replica: str, request_id: str) -> None:
        """``request_id`` finished on ``replica`` (a no-op for a request never routed there)."""
        if self.in_flight.get(request_id) != replica:
            return
        del self.in_flight[request_id]
        left = self.counts.get(replica, 0) - 1
        if left > 0:
            self.counts[replica] = left
        else:
            self.counts.pop(replica, None)

    def drop(self, replica: str) -> None:
        """Forgets ``replica`` (it died or left): its prefixes and its requests in flight."""
        self.tree.remove_replica(replica)
        self.counts.pop(replica, None)
        for request_id in [i for i, r in self.in_flight.items() if r == replica]:
            del self.in_flight[request_id]

    def keep_only(self, replicas: Iterable[str]) -> None:
        """Forgets every replica not in ``replicas`` (Ray's new replica set)."""
        alive = set(replicas)
        known = self.tree.replicas() | set(self.counts)
        for replica in known - alive:
            self.drop(replica)
