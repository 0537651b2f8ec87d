"""Embedding routes: OpenAI's ``POST /v1/embeddings``, vLLM's ``POST /pooling`` and TEI's
``POST /embed`` (errors in OpenAI's shape; see docs/server.md, "Pooling")."""

from __future__ import annotations

import base64
import time
import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from jaxgen.engine.pooling import PoolingInput, PoolingParams
from jaxgen.engine.pooling.pooling_requests import class_vectors, embedding_vectors
from serving.pooling import input_token_lists, serve_pooling
from serving.validation import Fields

ENCODING_FORMATS = ("float", "base64")


async def embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``: ``input`` (strings or token ids), ``encoding_format`` (float or
    base64: little-endian float32, as OpenAI's), ``dimensions`` (Matryoshka models)."""
    return await serve_pooling(request, parse_embeddings, run_embeddings, openai_response)


async def pooling(request: Request) -> Response:
    """``POST /pooling`` (vLLM's): each input's pooler output as ``data``: its embedding, or
    a classifier's probabilities."""
    return await serve_pooling(request, parse_embeddings, run_pooling_outputs, pooling_response)


async def embed(request: Request) -> Response:
    """``POST /embed`` (TEI's): ``inputs`` (a string or a list), ``normalize`` (default true)
    -> a list of embeddings."""
    return await serve_pooling(request, parse_tei, run_tei, tei_response)


def parse_embeddings(state, fields: Fields):
    token_lists = input_token_lists(state, fields.data.get("input"))
    encoding_format = fields.string("encoding_format", "float")
    if encoding_format not in ENCODING_FORMATS:
        raise fields.error("encoding_format", f"must be one of {ENCODING_FORMATS}")
    params = PoolingParams(
        dimensions=fields.integer("dimensions", minimum=1), normalize=fields.boolean("normalize")
    )
    return token_lists, encoding_format, params


def run_embeddings(engine, parsed):
    token_lists, _, params = parsed
    return embedding_vectors(engine, token_lists, params)


def run_pooling_outputs(engine, parsed):
    token_lists, _, params = parsed
    if engine.classifies:
        return class_vectors(engine, [PoolingInput(tokens) for tokens in token_lists])
    return embedding_vectors(engine, token_lists, params)


def usage(token_lists: list[list[int]]) -> dict:
    tokens = sum(len(tokens) for tokens in token_lists)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def encoded(vector: np.ndarray, encoding_format: str):
    """A vector as a JSON list, or OpenAI's base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
    return vector.tolist()


def openai_response(state, parsed, vectors) -> dict:
    token_lists, encoding_format, _ = parsed
    data = [
        {"object": "embedding", "index": i, "embedding": encoded(v, encoding_format)}
        for i, v in enumerate(vectors)
    ]
    model = state.settings.model_name
    return {"object": "list", "data": data, "model": model, "usage": usage(token_lists)}


def pooling_response(state, parsed, vectors) -> dict:
    token_lists, encoding_format, _ = parsed
    data = [
        {"index": i, "object": "pooling", "data": encoded(v, encoding_format)}
        for i, v in enumerate(vectors)
    ]
    return {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": state.settings.model_name,
        "data": data,
        "usage": usage(token_lists),
    }


def parse_tei(state, fields: Fields):
    token_lists = input_token_lists(state, fields.data.get("inputs"), "inputs")
    return token_lists, PoolingParams(normalize=fields.boolean("normalize", True))


def run_tei(engine, parsed):
    return embedding_vectors(engine, *parsed)


def tei_response(state, parsed, vectors) -> list:
    return [v.tolist() for v in vectors]


ROUTES = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/pooling", pooling, methods=["POST"]),
    Route("/embed", embed, methods=["POST"]),
]
