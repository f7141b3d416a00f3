"""JSON answers gzip'd for the clients that accept gzip — and only for them.

Starlette's ``GZipMiddleware`` compresses whenever ``gzip`` occurs anywhere in ``Accept-Encoding``,
so ``gzip;q=0`` — RFC 9110 §12.5.3: "not acceptable" — still gets gzip. This reads the header's
weights first and leaves a request that refuses gzip to the app unchanged; everything else (the
minimum size, the content types it skips: ``text/event-stream``; WebSockets untouched) is
Starlette's.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import Receive, Scope, Send


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` accepts gzip: ``gzip`` (or ``x-gzip``) with a weight above 0, or
    ``*`` above 0 with no weight of its own for gzip."""
    named: float | None = None
    wildcard: float | None = None
    for element in accept_encoding.split(","):
        coding, _, params = element.partition(";")
        coding = coding.strip().lower()
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0  # a weight that does not parse accepts nothing
        if coding in ("gzip", "x-gzip"):
            named = weight if named is None else max(named, weight)
        elif coding == "*":
            wildcard = weight
    if named is not None:
        return named > 0
    return wildcard is not None and wildcard > 0


class GzipAnswers(GZipMiddleware):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not gzip_accepted(Headers(scope=scope).get("accept-encoding", "")):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
