"""The engine interface (jaxgen.engine.engine_interface.Engine): the plain, replicated and multi-host
leader engines each implement every member, and the leader forwards what it does not publish."""

from __future__ import annotations

import types

import pytest

from jaxgen.engine.engine_interface import Engine
from jaxgen.engine.llm_engine import LLMEngine
from jaxgen.parallel.multihost import LeaderEngine, follow_leader
from jaxgen.parallel.replicas import ReplicatedEngine

METHODS = sorted(
    name for name, value in vars(Engine).items() if callable(value) and not name.startswith("_")
)
PROPERTIES = sorted(name for name, value in vars(Engine).items() if isinstance(value, property))
ATTRIBUTES = sorted(Engine.__annotations__)


def test_the_interface_names_what_callers_drive():
    assert {"add_request", "abort", "step", "has_unfinished", "stats", "shutdown"} <= set(METHODS)
    assert {"loaded", "config", "batching", "requests", "num_steps"} <= set(ATTRIBUTES)
    assert "params" in PROPERTIES


@pytest.mark.parametrize("cls", [LLMEngine, ReplicatedEngine, LeaderEngine])
def test_each_engine_implements_every_method(cls):
    assert Engine in cls.__mro__
    inherited = [name for name in METHODS + PROPERTIES if getattr(cls, name) is vars(Engine)[name]]
    assert inherited == []


class _Channel:
    def __init__(self):
        self.published = []

    def publish(self, index, commands):
        self.published.append((index, commands))


class _Recording:
    """An engine whose every member records its use."""

    def __init__(self):
        self.calls = []
        for name in ATTRIBUTES + PROPERTIES:
            setattr(self, name, f"engine.{name}")
        self.config = types.SimpleNamespace(batching="continuous")

    def __getattr__(self, name):
        def method(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return name

        return method


def test_the_leader_forwards_every_member_it_does_not_publish():
    engine = _Recording()
    leader = LeaderEngine(engine, _Channel())
    assert "__getattr__" not in vars(LeaderEngine)
    for name in ATTRIBUTES + PROPERTIES:
        assert getattr(leader, name) is getattr(engine, name), name
    for name in ("has_unfinished", "precompile", "stats", "reset_prefix_cache"):
        getattr(leader, name)()
        assert engine.calls[-1][0] == name


def test_the_leader_passes_a_compiled_grammar_on_and_publishes_the_request():
    engine, channel = _Recording(), _Channel()
    leader = LeaderEngine(engine, channel)
    leader.add_request("r0", None, [1, 2], "params", compiled_grammar="grammar")
    assert engine.calls[-1] == (
        "add_request",
        ("r0", None, [1, 2], "params"),
        {"arrival_time": None, "compiled_grammar": "grammar"},
    )
    leader.add_request("r1", None, [3], "params", priority=-2)
    assert engine.calls[-1] == (
        "add_request",
        ("r1", None, [3], "params"),
        {"arrival_time": None, "compiled_grammar": None, "priority": -2},
    )
    leader.step()
    assert channel.published == [
        (0, [("add", "r0", None, [1, 2], "params", 0), ("add", "r1", None, [3], "params", -2)])
    ]


def test_a_follower_repeats_the_leaders_requests_with_their_priority():
    engine, channel = _Recording(), _Channel()
    leader = LeaderEngine(engine, channel)
    leader.add_request("r0", None, [1, 2], "params", priority=3)
    leader.step()
    leader.shutdown()
    steps = iter(commands for _, commands in channel.published)
    follower = _Recording()
    reader = types.SimpleNamespace(receive=lambda index, timeout_s: next(steps))
    assert follow_leader(follower, reader) == 1
    name, args, kwargs = follower.calls[0]
    assert (name, args, kwargs["priority"]) == ("add_request", ("r0", None, [1, 2], "params"), 3)
    assert follower.calls[1][0] == "step"
