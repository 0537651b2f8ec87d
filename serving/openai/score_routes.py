"""Scoring routes: vLLM's ``POST /score`` (``/v1/score``) and the rerank API of Jina and Cohere,
``POST /rerank`` (``/v1/rerank``, ``/v2/rerank``): a cross-encoder's probability of each pair,
or an embedding model's cosine (see docs/server.md, "Pooling")."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from jaxgen.engine.pooling.pooling_requests import score_pairs, scores
from serving.pooling import serve_pooling
from serving.validation import Fields, RequestError

MAX_TEXTS = 4096  # texts on either side of one request


async def score(request: Request) -> Response:
    """``POST /score``: ``text_1`` (a string or a list) against ``text_2`` (one against each,
    or the lists zipped) -> ``data: [{index, object: "score", score}]``."""
    return await serve_pooling(request, parse_score, run_scores, score_response)


async def rerank(request: Request) -> Response:
    """``POST /rerank``: ``query``, ``documents`` (strings or ``{"text"}``), ``top_n``,
    ``return_documents`` -> ``results: [{index, relevance_score, document}]``, best first."""
    return await serve_pooling(request, parse_rerank, run_scores, rerank_response)


def parse_score(state, fields: Fields):
    first = fields.string_list("text_1", max_items=MAX_TEXTS)
    second = fields.string_list("text_2", max_items=MAX_TEXTS)
    for name, texts in (("text_1", first), ("text_2", second)):
        if not texts:
            raise fields.error(name, "must be a non-empty string or list of strings")
    try:
        return score_pairs(first if len(first) > 1 else first[0], second)
    except ValueError as error:
        raise RequestError(str(error), param="text_2") from None


def parse_rerank(state, fields: Fields):
    query = fields.string("query")
    if not query:
        raise fields.error("query", "must be a non-empty string")
    documents = fields.data.get("documents")
    if not isinstance(documents, list) or not documents or len(documents) > MAX_TEXTS:
        raise fields.error("documents", f"must be a list of 1 to {MAX_TEXTS} documents")
    texts = [document_text(fields, i, d) for i, d in enumerate(documents)]
    top_n = fields.integer("top_n", len(texts), minimum=1)
    return_documents = fields.boolean("return_documents", True)
    return [(query, text) for text in texts], top_n, return_documents


def document_text(fields: Fields, index: int, document) -> str:
    """A document: a string, or an object with ``text`` (Cohere's and Jina's)."""
    text = document.get("text") if isinstance(document, dict) else document
    if not isinstance(text, str) or not text:
        raise RequestError(
            f"`documents[{index}]` must be a non-empty string or an object with `text`",
            param="documents",
        )
    return text


def run_scores(engine, parsed):
    pairs = parsed if isinstance(parsed, list) else parsed[0]
    return scores(engine, pairs)


def score_response(state, pairs, result) -> dict:
    values, token_lists = result
    tokens = sum(len(tokens) for tokens in token_lists)
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": state.settings.model_name,
        "data": [{"index": i, "object": "score", "score": v} for i, v in enumerate(values)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def rerank_response(state, parsed, result) -> dict:
    pairs, top_n, return_documents = parsed
    values, token_lists = result
    order = sorted(range(len(values)), key=lambda i: values[i], reverse=True)[:top_n]
    results = []
    for i in order:
        entry = {"index": i, "relevance_score": values[i]}
        if return_documents:
            entry["document"] = {"text": pairs[i][1]}
        results.append(entry)
    tokens = sum(len(tokens) for tokens in token_lists)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": state.settings.model_name,
        "usage": {"total_tokens": tokens},
        "results": results,
    }


ROUTES = [
    Route("/score", score, methods=["POST"]),
    Route("/v1/score", score, methods=["POST"]),
    Route("/rerank", rerank, methods=["POST"]),
    Route("/v1/rerank", rerank, methods=["POST"]),
    Route("/v2/rerank", rerank, methods=["POST"]),
]
