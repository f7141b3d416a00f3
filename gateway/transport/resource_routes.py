"""How the resource APIs (conversations, files, vector stores) register their routes: each at
``/v1{path}`` and at ``path`` (an alias left out of the schema), its faults answered as an
OpenAI-shaped 500 logged rate-limited (``http_routes.route_fault``), not Starlette's plain-text one
with uvicorn's traceback. Said once here instead of three decorators on every route of every API.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter
from fastapi.responses import Response

from gateway.transport.http_routes import route_fault
from gateway.wire.errors import ApiError, is_fault

__all__ = ["Route", "json_answer", "resource_route"]

Route = Callable[..., Awaitable[Response]]


def resource_route(router: APIRouter, area: str) -> Callable[[str, str], Callable[[Route], Route]]:
    """A ``route(method, path)`` decorator for ``router``; ``area`` names its faults in the log.
    FastAPI reads each route's own signature through ``functools.wraps``."""

    def route(method: str, path: str) -> Callable[[Route], Route]:
        def register(handler: Route) -> Route:
            @functools.wraps(handler)
            async def answered(**kwargs: Any) -> Response:
                try:
                    return await handler(**kwargs)
                except BaseException as exc:
                    if isinstance(exc, ApiError) or not is_fault(exc):
                        raise
                    raise route_fault(kwargs["request"].app.state.gateway, f"{area} {handler.__name__}") from None

            router.api_route(path, methods=[method], include_in_schema=False)(answered)
            router.api_route("/v1" + path, methods=[method])(answered)
            return answered

        return register

    return route


def json_answer(data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), media_type="application/json", headers=headers)
