"""``serving/ray_routing/prefix_tree.py``: the routed texts' radix tree, without Ray."""

from __future__ import annotations

import random

import pytest

from serving.ray_routing.prefix_tree import PrefixTree, common_prefix_length


def owned_text_lengths(tree: PrefixTree) -> dict[str, int]:
    """Each replica's owned characters, recounted from the nodes (checks ``owned_chars``)."""
    counts: dict[str, int] = {}
    stack = [tree.root]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            assert child.parent is node and child.text and child.owners
            assert set(child.owners) <= set(node.owners) or node is tree.root
            for replica in child.owners:
                counts[replica] = counts.get(replica, 0) + len(child.text)
            stack.append(child)
    return counts


def test_common_prefix_length_of_an_edge_and_a_text_position():
    assert common_prefix_length("hello", "say hello there", 4) == 5
    assert common_prefix_length("help", "say hello", 4) == 3
    assert common_prefix_length("hello world", "hello", 0) == 5  # the text ends first
    assert common_prefix_length("abc", "xyz", 0) == 0
    assert common_prefix_length("", "abc", 0) == 0


def test_longest_prefix_and_its_owners():
    tree = PrefixTree()
    tree.insert("system: be brief|user: hi", "a")
    tree.insert("system: be brief|user: bye", "b")
    assert tree.match("system: be brief|user: hi|assistant: hello") == (25, ["a"])
    assert tree.match("system: be brief|user: b") == (24, ["b"])
    assert tree.match("system: be brief|user: what") == (23, ["a", "b"])  # the shared part
    assert tree.match("unrelated") == (0, [])
    assert tree.match("") == (0, [])
    assert owned_text_lengths(tree) == {"a": 25, "b": 26}
    assert tree.chars("a") == 25 and tree.chars("b") == 26 and tree.chars("c") == 0


def test_match_only_among_the_given_replicas():
    tree = PrefixTree()
    tree.insert("conversation one, turn one", "a")
    tree.insert("conversation one", "b")
    assert tree.match("conversation one, turn two", ["a", "b"]) == (23, ["a"])
    assert tree.match("conversation one, turn two", ["b"]) == (16, ["b"])
    assert tree.match("conversation one, turn two", ["c"]) == (0, [])


def test_a_later_turn_extends_the_path_of_the_earlier_one():
    tree = PrefixTree()
    tree.insert("u: hi", "a")
    tree.insert("u: hi a: hello u: how are you", "a")
    assert tree.match("u: hi a: hello u: how are you a: fine u: good") == (29, ["a"])
    assert owned_text_lengths(tree) == {"a": 29} == {"a": tree.chars("a")}


def test_removing_a_replica_forgets_its_text_and_prunes_nodes():
    tree = PrefixTree()
    tree.insert("shared prefix then a", "a")
    tree.insert("shared prefix then b", "b")
    tree.remove_replica("a")
    assert tree.match("shared prefix then a") == (19, ["b"])
    assert tree.replicas() == {"b"}
    assert owned_text_lengths(tree) == {"b": 20}
    tree.remove_replica("b")
    assert tree.root.children == {} and tree.replicas() == set()
    tree.remove_replica("never-seen")  # a no-op


def test_the_bound_evicts_the_least_recently_used_text_first():
    tree = PrefixTree(max_chars_per_replica=100)
    tree.insert("A" * 40, "a")
    tree.insert("B" * 40, "a")
    tree.insert("A" * 40 + "a", "a")  # touches A's path again: B is now the oldest
    tree.insert("C" * 40, "a")  # 121 > 100: evicts down to 90
    assert tree.match("B" * 40) == (0, [])
    assert tree.match("A" * 40 + "a")[0] == 41 and tree.match("C" * 40)[0] == 40
    assert tree.chars("a") <= 100
    assert owned_text_lengths(tree) == {"a": tree.chars("a")}


def test_eviction_is_per_replica_and_keeps_other_owners_of_a_node():
    tree = PrefixTree(max_chars_per_replica=50)
    tree.insert("X" * 30, "a")
    tree.insert("X" * 30, "b")
    tree.insert("Y" * 30, "a")  # a: 60 > 50; its oldest leaf (X) goes, b keeps it
    assert tree.match("X" * 30) == (30, ["b"])
    assert tree.match("Y" * 30) == (30, ["a"])
    assert owned_text_lengths(tree) == {"a": 30, "b": 30}


def test_eviction_walks_up_from_a_leaf_to_its_parent():
    tree = PrefixTree(max_chars_per_replica=60)
    tree.insert("P" * 20 + "q" * 20, "a")  # the path P... then q...
    tree.insert("P" * 20 + "r" * 10, "a")  # splits it: P (20), q (20), r (10)
    tree.insert("Z" * 40, "a")  # 90 > 60, down to 54: q, r, then P go (oldest, leaves first)
    assert tree.match("P" * 20) == (0, [])
    assert tree.match("Z" * 40) == (40, ["a"])
    assert owned_text_lengths(tree) == {"a": 40}


def test_random_inserts_keep_the_counts_and_the_bound():
    rng = random.Random(0)
    tree = PrefixTree(max_chars_per_replica=2000)
    texts = []
    for i in range(400):
        base = rng.choice(texts) if texts and rng.random() < 0.6 else ""
        text = base[: rng.randint(0, len(base))] + "".join(rng.choice("abc") for _ in range(30))
        texts.append(text)
        replica = rng.choice("xyz")
        tree.insert(text, replica)
        assert tree.match(text, [replica]) == (len(text), [replica])  # just inserted: all there
        if i % 50 == 0:
            tree.remove_replica(rng.choice("xyz"))
    counts = owned_text_lengths(tree)
    assert counts == {r: tree.chars(r) for r in tree.replicas() if tree.chars(r)}
    assert all(count <= 2000 for count in counts.values())


def test_a_bad_bound_is_a_value_error():
    with pytest.raises(ValueError, match="max_chars_per_replica"):
        PrefixTree(max_chars_per_replica=0)
