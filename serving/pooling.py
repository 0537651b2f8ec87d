"""What the pooling routes share: the server's pooling engine (a pooling model's, or one beside a
generation model whose checkpoint declares a sentence-transformers pooler), its thread, and
the ``input`` field's forms.

A server started with ``--task embed`` (or on an encoder) runs a ``PoolingLLM`` in place of
``AsyncLLM``: it answers what ``ServerState`` asks of a model (tokenizer, limits, stats) and
refuses generation with a 400 naming the task. Each pooling request is tokenized on a parse
lane, then runs its forward passes on the pooling thread (one: the engine takes one batch at
a time), never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor

from starlette.responses import JSONResponse
from starlette.routing import Route

from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.structured.grammar_masks import grammar_compiler
from jaxgen.loaders.pooling_model import open_pooling_engine, pooling_beside
from serving.openai.routes import admitted, openai_error
from serving.streaming import run_until_disconnect
from serving.validation import Fields, RequestError, check_token_ids

logger = logging.getLogger("serving")


class PoolingLLM:
    """A pooling model behind the server (see the module docstring)."""

    def __init__(self, engine, task: str):
        self.engine = engine  # a jaxgen.engine.pooling.PoolingEngine
        self.task = task
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.model_config = engine.model_config
        self.dead = None
        self.threads = ThreadPoolExecutor(1, thread_name_prefix="jaxgen-pooling")

    def stats(self) -> dict:
        return self.engine.stats()

    def grammar_compiler(self):
        config = self.model_config
        return grammar_compiler(self.tokenizer, config.vocab_size, config.eos_token_ids)

    async def generate(self, *args, **kwargs):
        raise ValueError(
            f"this server runs a pooling model (task {self.task!r}): it serves /v1/embeddings, "
            "/pooling, /score and /rerank, not generation (chat, completions)"
        )
        yield  # an async generator, as AsyncLLM.generate

    async def abort(self, request_id: str) -> None:
        return None

    def shutdown(self, timeout: float = 10.0) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)


def build_pooling_llm(settings, knobs: dict, model: str) -> PoolingLLM | None:
    """The server's ``PoolingLLM`` when ``--task`` (or the checkpoint, an encoder's) asks for
    pooling; None: the model generates."""
    config = EngineConfig(**knobs)
    engine = open_pooling_engine(model, dtype=settings.dtype, config=config)
    if engine is None:
        return None
    logger.info("loaded %s for pooling (%s)", engine.loaded.source, config.task)
    return PoolingLLM(engine, config.task)


def _engine_beside(llm):
    """A pooling engine beside the generation model ``llm`` (None: its checkpoint declares no
    pooler). Built on the pooling thread: it reads the checkpoint's files and plans a step."""
    engine = getattr(llm, "engine", None)
    loaded = getattr(engine, "loaded", None)
    config = getattr(engine, "config", None)
    if loaded is None or not isinstance(config, EngineConfig):
        return None
    return pooling_beside(loaded, config)


async def pooling_of(request) -> tuple[object, ThreadPoolExecutor]:
    """The server's pooling engine and its thread; a 400 when the model has no pooling. Beside
    a generation model the engine is made on first use, on its thread, once: later requests
    await the same future, and the event loop never runs the build."""
    state = request.app.state.server
    llm = state.llm
    if isinstance(llm, PoolingLLM):
        return llm.engine, llm.threads
    beside = getattr(request.app.state, "pooling_beside", None)
    if beside is None or beside[0] is not llm:
        threads = ThreadPoolExecutor(1, thread_name_prefix="jaxgen-pooling")
        built = asyncio.get_running_loop().run_in_executor(threads, _engine_beside, llm)
        beside = (llm, built, threads)
        request.app.state.pooling_beside = beside
    engine = await asyncio.shield(beside[1])
    if engine is None:
        raise RequestError(
            "this model has no pooling defined (its checkpoint ships no sentence-transformers "
            "modules.json): start the server with --task embed to embed with it",
            param="model",
        )
    return engine, beside[2]


async def run_pooling(request, threads: ThreadPoolExecutor, fn, *args):
    """``fn(*args)`` on the pooling thread; a ``ValueError`` it raises is a 400."""

    def work():
        try:
            return fn(*args)
        except ValueError as error:
            raise RequestError(str(error)) from None

    future = asyncio.get_running_loop().run_in_executor(threads, work)
    return await run_until_disconnect(request.receive, future)


def input_token_lists(state, value, param: str = "input") -> list[list[int]]:
    """OpenAI's ``input``: a string, a list of strings, a token-id list, or a list of them."""
    vocab = state.limits.vocab_size
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RequestError(
            f"`{param}` must be a string, a list of strings or of token-id lists", param=param
        )
    tokenizer = state.llm.tokenizer
    lists = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise RequestError(f"`{param}[{index}]` is an empty string", param=param)
            lists.append(tokenizer.encode(item, add_special_tokens=True))
        else:
            lists.append(check_token_ids(item, vocab, f"{param}[{index}]"))
    return lists


async def serve_pooling(request, parse, run, respond):
    """A pooling route: admits the request, ``parse(state, fields)`` on a parse lane,
    ``run(engine, parsed)`` on the pooling thread, ``respond(state, parsed, result)`` -> JSON;
    errors in OpenAI's shape."""
    ticket = None
    try:
        state, body, ticket = await admitted(request)
        engine, threads = await pooling_of(request)
        size = getattr(request.state, "body_bytes", 0)
        parsed = await state.workers.parse(size, lambda: parse(state, Fields(body)))
        result = await run_pooling(request, threads, run, engine, parsed)
        return JSONResponse(respond(state, parsed, result))
    except RequestError as error:
        return openai_error(error)
    finally:
        if ticket is not None:
            ticket.release()


def refuse_generation_on_pooling(routes: list, keep: list) -> list:
    """``routes`` with every POST route not in ``keep`` refusing a pooling model (a 400
    naming the task) before it reads its body; the others as they are."""
    return [
        route
        if "POST" not in (getattr(route, "methods", None) or ()) or any(route is k for k in keep)
        else Route(route.path, _generation_only(route.endpoint), methods=list(route.methods))
        for route in routes
    ]


def _generation_only(endpoint):
    @functools.wraps(endpoint)
    async def guarded(request):
        llm = request.app.state.server.llm
        if isinstance(llm, PoolingLLM):
            raise RequestError(
                f"{request.url.path} needs a generation model; this server runs a pooling model "
                f"(task {llm.task!r}): use /v1/embeddings, /pooling, /score or /rerank",
                param="model",
            )
        return await endpoint(request)

    return guarded
