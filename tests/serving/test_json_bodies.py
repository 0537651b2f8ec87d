"""Answers encoded in slices are byte for byte Starlette's ``JSONResponse``, and large answers
are built on the format lane (``Workers.respond``)."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from starlette.responses import JSONResponse

from serving.json_bodies import SLICE_ITEMS, SlicedJSONResponse, json_body, json_pieces
from serving.workers import SMALL_ANSWER_TOKENS, Workers


def random_value(rng: random.Random, depth: int = 0):
    """A random JSON value: long arrays (around the slice and item-by-item sizes), objects with
    string and integer keys, text beyond ASCII and the BMP, floats, nulls."""
    kind = rng.choice(
        ["int", "float", "str", "null", "bool", "list", "dict"] if depth < 4 else ["int", "str"]
    )
    if kind == "int":
        return rng.randint(-(10**12), 10**12)
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "str":
        return rng.choice(["", "Ġworld", "naïve", "日本", '😀\n\t"\\', "\x00\x1f", "a" * 300])
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        size = rng.choice([0, 1, 3, 64, 65, SLICE_ITEMS, SLICE_ITEMS + 1, 3 * SLICE_ITEMS + 7])
        return [random_value(rng, depth + 2) for _ in range(size)]
    keys = [
        rng.choice(["a", "ключ", "token_strs", "😀", ""]) + str(i) for i in range(rng.randint(0, 6))
    ]
    if rng.random() < 0.2:  # JSON turns integer keys into strings
        return {i: random_value(rng, depth + 1) for i in range(3)}
    return {key: random_value(rng, depth + 1) for key in keys}


@pytest.mark.parametrize("seed", range(20))
def test_json_body_is_json_responses_bytes(seed):
    value = {"choices": [random_value(random.Random(seed)) for _ in range(3)]}
    assert json_body(value) == JSONResponse(value).body


def test_a_tokenize_answer_is_the_same_bytes():
    tokens = list(range(5 * SLICE_ITEMS + 3))
    value = {"count": len(tokens), "tokens": tokens, "token_strs": [f"Ġ{t}" for t in tokens]}
    assert json_body(value) == JSONResponse(value).body
    for empty in ({}, [], {"tokens": [], "token_strs": None}, "", 0):
        assert json_body(empty) == JSONResponse(empty).body


def test_long_arrays_are_encoded_a_slice_at_a_time():
    """No piece (one ``json.dumps``, holding the GIL while it runs) holds more than
    ``SLICE_ITEMS`` items of a long array."""
    value = {"tokens": list(range(10 * SLICE_ITEMS)), "token_strs": ["x"] * (10 * SLICE_ITEMS)}
    pieces = json_pieces(value)
    assert max(piece.count(b",") for piece in pieces) <= SLICE_ITEMS
    assert len(pieces) >= 20
    assert b"".join(pieces) == JSONResponse(value).body


def test_not_a_number_is_refused_as_json_response_refuses_it():
    for value in ({"logprob": float("nan")}, [float("inf")] * (SLICE_ITEMS + 1)):
        with pytest.raises(ValueError):
            JSONResponse(value)
        with pytest.raises(ValueError):
            json_body(value)


def test_sliced_response_has_json_responses_status_and_headers():
    value = {"prompt": "日本" * 1000}
    sliced = SlicedJSONResponse(value, status_code=201, headers={"x-prompt-tokens": "3"})
    plain = JSONResponse(value, status_code=201, headers={"x-prompt-tokens": "3"})
    assert sliced.body == plain.body
    assert sliced.status_code == plain.status_code == 201
    assert sliced.raw_headers == plain.raw_headers


def test_large_answers_are_built_on_the_format_lane():
    workers = Workers(grammar_compile_workers=1, max_queued_grammar_compiles=1)

    async def thread_of(tokens: int) -> str:
        return await workers.respond(tokens, lambda: threading.current_thread().name)

    try:
        small = asyncio.run(thread_of(SMALL_ANSWER_TOKENS))
        large = asyncio.run(thread_of(SMALL_ANSWER_TOKENS + 1))
    finally:
        workers.shutdown()
    assert small == threading.current_thread().name  # on the event loop: no round trip
    assert large.startswith("jaxgen-format")
