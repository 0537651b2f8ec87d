"""``serving/ray_routing/prefix_policy.py``: where a request goes, without Ray."""

from __future__ import annotations

import pytest

from serving.ray_routing.prefix_policy import PrefixPolicy

TURN_1 = "model|system: be brief|user: what is the capital of France?"
TURN_2 = TURN_1 + "|assistant: Paris.|user: and of Italy?"


def test_a_conversation_follows_the_replica_that_served_its_last_turn():
    policy = PrefixPolicy(seed=0)
    policy.routed(TURN_1, "b", "r1")
    policy.completed("b", "r1")
    assert policy.rank(TURN_2, {"a": 0, "b": 0}) == [["b"], ["a"]]


def test_no_match_is_two_random_choices_least_loaded_first():
    policy = PrefixPolicy(seed=0)
    loads = {"a": 3, "b": 1, "c": 2}
    ranks = [policy.rank("a new conversation", loads) for _ in range(30)]
    for (pair,) in ranks:
        assert len(set(pair)) == 2 and set(pair) <= set(loads)
        assert loads[pair[0]] <= loads[pair[1]]
    assert {tuple(sorted(pair)) for (pair,) in ranks} == {("a", "b"), ("a", "c"), ("b", "c")}
    assert policy.rank("", {"a": 0}) == [["a"]]  # no text (e.g. /metrics): by load alone
    assert policy.rank("anything", {}) == []


def test_between_equal_loads_a_new_conversation_goes_where_less_text_is_held():
    policy = PrefixPolicy(seed=0)
    policy.routed("x" * 500, "a", "r1")
    policy.completed("a", "r1")
    for _ in range(10):
        assert policy.rank("a different conversation", {"a": 0, "b": 0}) == [["b", "a"]]
    # a request with no text has nothing to cache: equals in load are taken in random order
    firsts = {policy.rank("", {"a": 0, "b": 0})[0][0] for _ in range(30)}
    assert firsts == {"a", "b"}


def test_an_overloaded_favourite_is_passed_over():
    policy = PrefixPolicy(imbalanced_threshold=2, seed=0)
    for i in range(3):
        policy.routed(TURN_1, "a", f"r{i}")  # three in flight on a
    assert policy.load("a") == 3
    # 3 - 0 > 2: the prefix is not worth queueing behind a's requests
    assert policy.rank(TURN_2, {"a": 3, "b": 0}) == [["b", "a"]]
    # within the threshold the prefix wins
    assert policy.rank(TURN_2, {"a": 2, "b": 0}) == [["a"], ["b"]]


def test_several_owners_are_tried_least_loaded_first_then_the_rest():
    policy = PrefixPolicy(seed=0)
    policy.routed(TURN_1, "a", "r1")
    policy.routed(TURN_1, "b", "r2")
    assert policy.rank(TURN_2, {"a": 2, "b": 1, "c": 0}) == [["b", "a"], ["c"]]


def test_a_later_turn_follows_its_conversation_however_long_the_reply():
    policy = PrefixPolicy(seed=0)  # match_rate_threshold 0.5
    policy.routed(TURN_1, "a", "r1")
    turn_2 = TURN_1 + "|assistant: " + "a long reply " * 40 + "|user: thanks"
    (pair,) = policy.rank(turn_2, {"a": 0, "b": 0})  # TURN_1 is under half of it: by load
    assert sorted(pair) == ["a", "b"]
    assert policy.rank(turn_2, {"a": 0, "b": 0}, history=len(TURN_1)) == [["a"], ["b"]]
    # a history the replica holds only part of is no conversation of its
    (pair,) = policy.rank(turn_2, {"a": 0, "b": 0}, history=len(TURN_1) + 5)
    assert sorted(pair) == ["a", "b"]


def test_a_short_match_does_not_count():
    policy = PrefixPolicy(match_rate_threshold=0.5, seed=0)
    policy.routed("model|system: a long shared system prompt|user: one", "a", "r1")
    long_question = "model|system: a long|" + "x" * 100
    (pair,) = policy.rank(long_question, {"a": 0, "b": 0})  # 21 of 121 characters: by load
    assert sorted(pair) == ["a", "b"]
    assert policy.rank("model|system: a long shared system prompt|user: two", {"a": 5, "b": 0})[
        0
    ] == ["a"]


def test_completions_release_slots_once_and_only_where_routed():
    policy = PrefixPolicy()
    policy.routed("t", "a", "r1")
    policy.routed("t", "a", "r2")
    policy.completed("b", "r1")  # not where r1 went: ignored
    assert policy.load("a") == 2
    policy.completed("a", "r1")
    policy.completed("a", "r1")  # twice: counted once
    assert policy.load("a") == 1
    policy.routed("t", "b", "r2")  # r2 re-routed (a retry): a's slot is released
    assert (policy.load("a"), policy.load("b")) == (0, 1)


def test_a_dead_replica_is_forgotten():
    policy = PrefixPolicy(seed=0)
    policy.routed(TURN_1, "a", "r1")  # still in flight when a dies
    policy.drop("a")
    assert policy.load("a") == 0 and policy.tree.replicas() == set()
    (pair,) = policy.rank(TURN_2, {"b": 0, "c": 0})
    assert sorted(pair) == ["b", "c"]
    policy.completed("a", "r1")  # the dead request's completion arrives late: a no-op
    assert policy.load("a") == 0


def test_a_new_replica_set_drops_the_replicas_gone():
    policy = PrefixPolicy(seed=0)
    policy.routed(TURN_1, "a", "r1")
    policy.routed("other", "b", "r2")
    policy.keep_only(["b", "c"])
    assert policy.tree.replicas() == {"b"} and policy.load("a") == 0 and policy.load("b") == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(imbalanced_threshold=-1), "imbalanced_threshold"),
        (dict(match_rate_threshold=1.5), "match_rate_threshold"),
        (dict(max_chars_per_replica=0), "max_chars_per_replica"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PrefixPolicy(**kwargs)
