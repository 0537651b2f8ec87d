"""An approximate radix tree of the texts a router sent to each replica.

Each node is an edge of text below its parent and records the replicas ("owners") that were sent
a text running through it, with when they last were (a logical clock). A replica owning a node
owns its whole path from the root. ``match`` finds the longest prefix of a text that some of the
given replicas own. Each replica's owned characters are bounded: past ``max_chars_per_replica``
its least recently used leaves are dropped (down to 90% of the bound, so the walk that finds
them runs once per tenth of the bound inserted, not per insert). The tree only approximates each
replica's prefix cache: it knows what was sent, not what the engine kept.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

EVICT_TO = 0.9  # eviction stops at this fraction of the bound


class _Node:
    __slots__ = ("text", "parent", "children", "owners")

    def __init__(self, text: str, parent: _Node | None):
        self.text = text  # the edge from the parent
        self.parent = parent
        self.children: dict[str, _Node] = {}  # by the child's first character
        self.owners: dict[str, int] = {}  # replica -> logical time of its last insert here


def common_prefix_length(edge: str, text: str, start: int) -> int:
    """How many leading characters of ``edge`` equal ``text[start:]``'s (compared in C)."""
    n = min(len(edge), len(text) - start)
    if text.startswith(edge[:n], start):
        return n
    low, high = 0, n - 1  # edge[:low] matches, edge[:high + 1] does not
    while low < high:
        mid = (low + high + 1) // 2
        if text.startswith(edge[:mid], start):
            low = mid
        else:
            high = mid - 1
    return low


class PrefixTree:
    """Texts routed to replicas (by id string), for the longest cached prefix of a new one.

    Args:
        max_chars_per_replica: most characters of text one replica owns before its least
            recently used leaves are evicted.
    """

    def __init__(self, *, max_chars_per_replica: int = 1 << 20):
        if max_chars_per_replica < 1:
            raise ValueError(f"max_chars_per_replica must be >= 1, got {max_chars_per_replica}")
        self.max_chars_per_replica = max_chars_per_replica
        self.root = _Node("", None)
        self.owned_chars: dict[str, int] = {}
        self.clock = 0

    def replicas(self) -> set[str]:
        """The replicas that own some text."""
        return set(self.owned_chars)

    def chars(self, replica: str) -> int:
        """Characters of text ``replica`` owns."""
        return self.owned_chars.get(replica, 0)

    def insert(self, text: str, replica: str) -> None:
        """Records that ``text`` was sent to ``replica`` (now its most recent use)."""
        self.clock += 1
        self._own(self.root, replica)
        node, position = self.root, 0
        while position < len(text):
            child = node.children.get(text[position])
            if child is None:
                child = _Node(text[position:], node)
                node.children[child.text[0]] = child
                self._own(child, replica)
                break
            common = common_prefix_length(child.text, text, position)
            if common < len(child.text):
                child = self._split(child, common)
            self._own(child, replica)
            node, position = child, position + common
        if self.owned_chars[replica] > self.max_chars_per_replica:
            self._evict(replica, int(self.max_chars_per_replica * EVICT_TO))

    def match(self, text: str, replicas: Iterable[str] | None = None) -> tuple[int, list[str]]:
        """The longest prefix of ``text`` owned by one of ``replicas`` (default: any): its
        length in characters and the replicas that own all of it (sorted; empty if none)."""
        allowed = None if replicas is None else set(replicas)

        def owners_of(node: _Node) -> set[str]:
            owners = set(node.owners)
            return owners if allowed is None else owners & allowed

        node, position, matched, owners = self.root, 0, 0, set()
        while position < len(text):
            child = node.children.get(text[position])
            if child is None:
                break
            live = owners_of(child)
            if not live:
                break
            common = common_prefix_length(child.text, text, position)
            matched, owners = position + common, live
            if common < len(child.text):
                break
            node, position = child, position + common
        return matched, sorted(owners)

    def remove_replica(self, replica: str) -> None:
        """Forgets everything sent to ``replica`` (it left the deployment)."""
        for node in self._owned_nodes(replica):
            self._disown(node, replica)
        self.root.owners.pop(replica, None)
        self.owned_chars.pop(replica, None)

    def _own(self, node: _Node, replica: str) -> None:
        if replica not in node.owners:
            self.owned_chars[replica] = self.owned_chars.get(replica, 0) + len(node.text)
        node.owners[replica] = self.clock

    def _disown(self, node: _Node, replica: str) -> None:
        del node.owners[replica]
        self.owned_chars[replica] -= len(node.text)
        if not node.owners and node.parent is not None:  # nobody's: the subtree is empty too
            del node.parent.children[node.text[0]]
            node.parent = None

    def _split(self, node: _Node, length: int) -> _Node:
        """Cuts ``node``'s edge after ``length`` characters; returns the new upper node."""
        parent = node.parent
        upper = _Node(node.text[:length], parent)
        upper.owners = dict(node.owners)
        parent.children[upper.text[0]] = upper
        node.text = node.text[length:]
        node.parent = upper
        upper.children[node.text[0]] = node
        return upper

    def _owned_nodes(self, replica: str) -> list[_Node]:
        """Every non-root node ``replica`` owns, children before their parents."""
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                if replica in child.owners:
                    found.append(child)
                    stack.append(child)
        found.reverse()  # a parent was found before its children
        return found

    def _evict(self, replica: str, target: int) -> None:
        """Drops ``replica``'s least recently used leaves until it owns ``target`` characters."""
        order = itertools.count()  # breaks ties between equal times without comparing nodes
        leaves = [
            (node.owners[replica], next(order), node)
            for node in self._owned_nodes(replica)
            if not any(replica in child.owners for child in node.children.values())
        ]
        heapq.heapify(leaves)
        while leaves and self.owned_chars[replica] > target:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            self._disown(node, replica)
            if (
                parent is not None
                and parent is not self.root
                and not any(replica in child.owners for child in parent.children.values())
            ):  # a parent is never used later than its children: it is next in time order
                heapq.heappush(leaves, (parent.owners[replica], next(order), parent))
