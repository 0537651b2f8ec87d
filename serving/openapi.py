"""``GET /openapi.json``: the server's routes as an OpenAPI 3.1 document, built from the route
table itself (each path, its methods, the handler's first docstring line as the summary), so
it lists exactly what the server answers; clients and fuzzers read it to learn the API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import jaxgen


def openapi_document(routes: list[Route]) -> dict:
    """The OpenAPI document of ``routes`` (path parameters such as ``{model:path}`` named
    plainly)."""
    paths: dict[str, dict] = {}
    for route in routes:
        path = route.path.replace(":path}", "}")
        doc = (route.endpoint.__doc__ or route.name).strip().splitlines()[0]
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            operation = {
                "summary": doc.replace("``", "`"),
                "operationId": f"{route.name}_{method.lower()}",
                "responses": {"200": {"description": "OK"}, "4XX": {"description": "error"}},
            }
            names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
            if names:
                operation["parameters"] = [
                    {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                    for name in names
                ]
            paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "jaxgen", "version": jaxgen.__version__},
        "paths": paths,
    }


def openapi_route(routes: list[Route]) -> Route:
    """The ``/openapi.json`` route for ``routes`` (itself included)."""
    route = None

    async def openapi(request: Request) -> JSONResponse:
        """``GET /openapi.json``: this document."""
        return JSONResponse(openapi_document([*routes, route]))

    route = Route("/openapi.json", openapi, methods=["GET"])
    return route
