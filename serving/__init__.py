"""jaxgen's HTTP server: TGI and OpenAI-compatible routes over ``AsyncLLM`` (starlette + uvicorn).

``create_app(llm, settings)`` builds the app; ``jaxgen serve`` / ``python -m serving`` run it.
"""


def create_app(*args, **kwargs):
    """See ``serving.app.create_app`` (imported lazily so ``jaxgen --help`` stays fast)."""
    from serving.app import create_app as build

    return build(*args, **kwargs)


__all__ = ["create_app"]
