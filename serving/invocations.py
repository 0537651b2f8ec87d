"""SageMaker's ``POST /invocations``, routed by the body's shape (SageMaker sends any of them):
``messages`` to chat completions, ``prompt`` to completions (OpenAI's bodies, as vLLM routes
them), anything else to TGI's ``/generate`` or ``/generate_stream`` (``inputs``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.common import accept
from serving.openai import routes as openai_routes
from serving.tgi import routes as tgi_routes
from serving.tgi.format import tgi_error
from serving.validation import RequestError


async def invocations(request: Request) -> Response:
    try:
        _, body = await accept(request)  # parsed once; the route reads it from request.state
    except RequestError as error:
        return tgi_error(error)
    if "messages" in body:
        return await openai_routes.chat_completions(request)
    if "prompt" in body and "inputs" not in body:
        return await openai_routes.completions(request)
    return await tgi_routes.compat_generate(request)


ROUTES = [Route("/invocations", invocations, methods=["POST"])]
