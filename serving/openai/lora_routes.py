"""vLLM's LoRA routes while serving: ``POST /v1/load_lora_adapter`` (``lora_name``,
``lora_path``) and ``POST /v1/unload_lora_adapter`` (``lora_name``), behind the API key like
every ``/v1`` route. An adapter is read and checked before it is offered (a bad one is a 400
naming it, and nothing of it is loaded); one that unfinished requests use is not unloaded (a
400: they go on)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from serving.common import accept
from serving.openai.routes import openai_error
from serving.validation import RequestError


def _name(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"`{key}` must be a non-empty string", param=key)
    return value


async def load_lora_adapter(request: Request) -> Response:
    """Reads an adapter and offers it as the model ``lora_name``."""
    try:
        state, body = await accept(request)
        name, path = _name(body, "lora_name"), _name(body, "lora_path")
        if state.loras.get(name) is not None or state.settings.serves_model(name):
            raise RequestError(f"The model `{name}` is already served", param="lora_name")
        lora = state.loras.new(name, path)
        try:
            await state.llm.add_lora(lora)
        except ValueError as error:
            state.loras.remove(name)
            raise RequestError(str(error), param="lora_path") from None
    except RequestError as error:
        return openai_error(error)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request) -> Response:
    """Stops offering the adapter ``lora_name`` and forgets it (refused while in use)."""
    try:
        state, body = await accept(request)
        name = _name(body, "lora_name")
        lora = state.loras.get(name)
        if lora is None:
            raise RequestError(
                f"The model `{name}` does not exist.", param="lora_name", kind="model_not_found"
            )
        try:
            await state.llm.remove_lora(lora.lora_int_id)
        except ValueError as error:
            raise RequestError(str(error), param="lora_name") from None
        state.loras.remove(name)
    except RequestError as error:
        return openai_error(error)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


ROUTES = [
    Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
]
