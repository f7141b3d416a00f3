"""Request and response ids carried by context variables, so every log line of a turn names them.

Why context variables: one WebSocket connection runs many turns on several lanes concurrently,
each in its own asyncio task; a task copies the context when it is created, so a lane worker that
sets ``response_id`` only affects the log lines of its own turn, and an SSE pump task started after
``prepare`` inherits the id. Nothing has to be threaded through call signatures.

``RequestIdMiddleware`` (pure ASGI, so streaming and disconnect handling are untouched) takes the
client's ``X-Request-Id`` or makes one, sets it for the request or WebSocket connection, and echoes
it on HTTP responses.
"""

from __future__ import annotations

import contextvars
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("respgate_request_id", default=None)
response_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("respgate_response_id", default=None)

_CLIENT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # echoed into logs and headers: keep it tame

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RequestIdMiddleware:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                rid = candidate if _CLIENT_ID.fullmatch(candidate) else None
                break
        rid = rid or "req_" + secrets.token_hex(12)
        token = request_id.set(rid)
        response_id.set(None)
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", ()), header])
            await send(message)

        try:
            await self.app(scope, receive, send_with_id if scope["type"] == "http" else send)
        finally:
            request_id.reset(token)
