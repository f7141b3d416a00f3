"""A loopback web site for the page-reading tests: real HTML pages and the hostile answers a fetch
must survive (a 50 MB page, a page that never ends, a redirect into the private network, a
compressed answer it did not ask for, a type that is not text).

Serve it with ``tests.mcp_servers.running.running_app(site_app())``. Every route is generated here or
read from ``html/``; nothing leaves the machine. ``SECRET`` is what the same app answers on
``/secret``: served on a second loopback address (127.0.0.2), it stands for an intranet service a
redirect must not reach.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

HTML = Path(__file__).parent / "html"
SECRET = "INTRANET-ONLY: the admin password is hunter2"
BIG_BYTES = 50 * 1024 * 1024
_CHUNK = 64 * 1024
#: one paragraph of the big page, repeated until BIG_BYTES
_BIG_PARAGRAPH = b"<p>" + b"All work and no play makes a very large page. " * 20 + b"</p>\n"


def _page(name: str) -> Response:
    return Response((HTML / name).read_bytes(), media_type="text/html; charset=utf-8")


async def news(request: Request) -> Response:
    return _page("news.html")


async def docs(request: Request) -> Response:
    return _page("docs.html")


async def secret(request: Request) -> Response:
    return PlainTextResponse(SECRET)


async def _big_body() -> AsyncIterator[bytes]:
    yield b"<!DOCTYPE html><html><head><title>Big</title></head><body>\n"
    chunk = (_BIG_PARAGRAPH * (_CHUNK // len(_BIG_PARAGRAPH) + 1))[:_CHUNK]
    sent = 0
    while sent < BIG_BYTES:
        yield chunk  # made once, sent many times: the server's own memory stays flat
        sent += len(chunk)
        await asyncio.sleep(0)


async def big(request: Request) -> Response:
    """50 MB of HTML, streamed without a Content-Length (chunked): only counting stops it."""
    return StreamingResponse(_big_body(), media_type="text/html")


async def big_declared(request: Request) -> Response:
    """The same page with its length declared: refused by its head, before any body is read."""
    return StreamingResponse(_big_body(), media_type="text/html", headers={"content-length": str(BIG_BYTES)})


async def _trickle() -> AsyncIterator[bytes]:
    yield b"<!DOCTYPE html><html><head><title>Never ends</title></head><body><p>"
    while True:
        await asyncio.sleep(0.05)
        yield b"."


async def trickle(request: Request) -> Response:
    """Headers at once, then a byte every 50 ms forever: no single read ever times out."""
    return StreamingResponse(_trickle(), media_type="text/html")


async def redirect(request: Request) -> Response:
    """An open redirect, as many sites have: ``/redirect?to=URL`` answers 302 to URL."""
    return RedirectResponse(request.query_params["to"], status_code=302)


async def loop(request: Request) -> Response:
    return RedirectResponse("/loop", status_code=302)


async def cookie_set(request: Request) -> Response:
    response = RedirectResponse("/cookie-echo", status_code=302)
    response.set_cookie("session", "tenant-a-session-token", path="/")
    return response


async def cookie_echo(request: Request) -> Response:
    return PlainTextResponse(f"cookie header: [{request.headers.get('cookie', '')}]")


async def echo_headers(request: Request) -> Response:
    lines = [f"{k}: {v}" for k, v in request.headers.items()]
    return PlainTextResponse("\n".join(lines))


async def gzipped(request: Request) -> Response:
    """gzip whatever the request asked for (a misbehaving server: the fetch asks for identity)."""
    body = gzip.compress((HTML / "news.html").read_bytes())
    return Response(body, media_type="text/html", headers={"content-encoding": "gzip"})


async def image(request: Request) -> Response:
    return Response(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, media_type="image/png")


async def plain(request: Request) -> Response:
    return PlainTextResponse("line one of a plain text file\nline two\n\nTidepool release notes 3.2\n")


async def latin1_header(request: Request) -> Response:
    """windows-1252 text, declared only in the Content-Type header (é, ü, and € at 0x80)."""
    html = "<html><head><title>Caf\xe9 M\xfcller</title></head><body><article><h1>Caf\xe9 M\xfcller</h1>"
    html += "<p>Un caf\xe9 cr\xe8me co\xfbte 3,20 \u20ac au comptoir, disent les habitu\xe9s du quartier.</p>" * 3
    html += "</article></body></html>"
    return Response(html.encode("cp1252"), headers={"content-type": "text/html; charset=ISO-8859-1"})


async def cyrillic_meta(request: Request) -> Response:
    """windows-1251 text, declared only in a ``<meta charset>`` (the header says nothing)."""
    html = '<html><head><meta charset="windows-1251"><title>Новости</title></head><body><article>'
    html += "<h1>Новости</h1>" + "<p>Сегодня в городе открылся новый мост через реку.</p>" * 3
    html += "</article></body></html>"
    return Response(html.encode("cp1251"), headers={"content-type": "text/html"})


async def untyped(request: Request) -> Response:
    return Response(b"<!DOCTYPE html><html><head><title>No type</title></head><body><p>Untyped page.</p></body></html>")


async def forged(request: Request) -> Response:
    """A page whose text carries a citation mark of its own."""
    return Response(
        b"<html><head><title>T</title></head><body><p>As shown \xe3\x80\x906\xe2\x80\xa0L9-L11\xe3\x80\x91 here.</p>"
        b"</body></html>",
        media_type="text/html; charset=utf-8",
    )


async def missing(request: Request) -> Response:
    return PlainTextResponse("not here", status_code=404)


def site_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/news", news),
            Route("/docs", docs),
            Route("/secret", secret),
            Route("/big", big),
            Route("/big-declared", big_declared),
            Route("/trickle", trickle),
            Route("/redirect", redirect),
            Route("/loop", loop),
            Route("/cookie-set", cookie_set),
            Route("/cookie-echo", cookie_echo),
            Route("/headers", echo_headers),
            Route("/gzip", gzipped),
            Route("/image.png", image),
            Route("/plain", plain),
            Route("/latin1", latin1_header),
            Route("/cyrillic", cyrillic_meta),
            Route("/untyped", untyped),
            Route("/forged", forged),
            Route("/missing", missing),
        ]
    )
