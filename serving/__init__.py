"""jaxgen's HTTP server: TGI and OpenAI-compatible routes over ``AsyncLLM`` (starlette + uvicorn).

``create_app(llm, settings)`` builds the app; ``jaxgen serve`` / ``python -m serving`` run it.
"""

from serving.app import create_app

__all__ = ["create_app"]
