"""A loopback stand-in for search services: SearXNG's JSON API, and Brave's and Tavily's APIs
answering recorded responses in their published formats (``recorded/``).

One Starlette app; the first path segment is the **mode**, so a backend's base URL picks how it
is answered while its own client code builds the rest of the path as against the real service:

- ``{url}/ok`` as a base URL: SearXNG (``GET /ok/search``, or ``POST`` with a form), Tavily
  (``POST /ok/search`` with JSON), Brave
  (``GET /ok/res/v1/web/search``). Brave and Tavily check the key (``BRAVE_KEY``,
  ``TAVILY_KEY``) and answer 401 echoing what they got, as a careless service might.
- failure modes, whatever the route: ``slow`` (no answer at all), ``trickle`` (a 200 whose body
  drips a space at a time, forever), ``endless`` (a 200 streaming 64 KiB chunks, forever),
  ``huge`` (a 200 declaring 64 MiB), ``garbage`` (an HTML page), ``shape`` (JSON of the wrong
  shape), ``deep`` (JSON nested 100 000 deep), ``ratelimited`` (429, ``Retry-After: 7``),
  ``error`` (500), ``redirect`` (302 to another origin), ``gzip`` (a gzip'd body nobody asked
  for), ``forbidden`` (403 echoing the query and headers it was sent), ``markup`` (SearXNG results
  with long, tag-laden texts), ``empty`` (Brave's answer with no ``web`` key), ``unresponsive``
  (SearXNG: no results, every engine listed as unresponsive), ``none`` (SearXNG: no results),
  ``custom`` (SearXNG: the results a test put in ``app.state.results``, e.g. pages of a loopback site).
  SearXNG's ``ok`` answer sets a cookie (which the client must not send back).

Every request is recorded in ``app.state.seen`` (method, path, query params, headers, JSON body)
so tests can check what the client sent.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

RECORDED = Path(__file__).parent / "recorded"
BRAVE_KEY = "BSA-test-key-0123456789abcdef"
TAVILY_KEY = "tvly-test-key-0123456789abcdef"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text(encoding="utf-8"))


def _markup_results() -> dict[str, Any]:
    long_text = "<p>" + "<b>word</b> &amp; " * 5000 + "</p>"
    return {
        "query": "markup",
        "results": [
            {"url": "https://example.com/a", "title": "<i>Title</i> " + "t" * 5000, "content": long_text},
            {"url": "https://example.com/b", "title": None, "content": 42},
        ],
    }


async def _forever_spaces() -> AsyncIterator[bytes]:
    yield b"{"
    while True:
        await asyncio.sleep(0.02)
        yield b" "


async def _forever_chunks() -> AsyncIterator[bytes]:
    chunk = b"[" + b"0," * 32767
    while True:
        yield chunk
        await asyncio.sleep(0)


def _ok(request: Request, rest: str, body: Any) -> Response:
    if rest == "res/v1/web/search":  # Brave
        key = request.headers.get("x-subscription-token", "")
        if key != BRAVE_KEY:
            return JSONResponse({"type": "ErrorResponse", "error": {"detail": f"bad token {key}"}}, status_code=401)
        return JSONResponse(recorded("brave_web_search.json"))
    if rest == "search" and request.method == "POST" and isinstance(body, dict) and "format" in body:  # SearXNG
        answer = recorded("searxng_search.json")
        answer["query"] = body.get("q", "")
        return JSONResponse(answer)
    if rest == "search" and request.method == "POST":  # Tavily
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {TAVILY_KEY}":
            return JSONResponse(
                {"detail": {"error": f"Unauthorized: missing or invalid API key {auth}"}}, status_code=401
            )
        return JSONResponse(recorded("tavily_search.json"))
    if rest == "search":  # SearXNG
        if request.query_params.get("format") != "json":
            return Response("format not enabled", status_code=403)
        answer = recorded("searxng_search.json")
        answer["query"] = request.query_params.get("q", "")
        response = JSONResponse(answer)
        response.set_cookie("searxng_session", "tracks-you", path="/")
        return response
    return Response("not found", status_code=404)


async def handle(request: Request) -> Response:
    mode = request.path_params["mode"]
    rest = request.path_params["rest"]
    body: Any = None
    if request.method == "POST" and request.headers.get("content-type", "").startswith("application/x-www-form"):
        body = dict(await request.form())  # SearXNG's API takes its parameters as a form, too
    elif request.method == "POST":
        raw = await request.body()
        body = json.loads(raw) if raw else None
    request.app.state.seen.append(
        {
            "method": request.method,
            "mode": mode,
            "path": rest,
            "params": dict(request.query_params),
            "headers": dict(request.headers),
            "json": body,
        }
    )
    if mode == "ok":
        return _ok(request, rest, body)
    if mode == "slow":
        await asyncio.sleep(3600)
    if mode == "trickle":
        return StreamingResponse(_forever_spaces(), media_type="application/json")
    if mode == "endless":
        return StreamingResponse(_forever_chunks(), media_type="application/json")
    if mode == "huge":
        declared = {"content-length": str(64 * 1024 * 1024)}
        return StreamingResponse(_forever_chunks(), headers=declared, media_type="application/json")
    if mode == "garbage":
        return Response("<html><body>It works!</body></html>", media_type="text/html")
    if mode == "shape":
        return JSONResponse({"results": {"url": "https://example.com/"}, "web": {"results": "none"}})
    if mode == "deep":
        return Response(b"[" * 100_000 + b"]" * 100_000, media_type="application/json")
    if mode == "ratelimited":
        return JSONResponse({"error": "slow down"}, status_code=429, headers={"retry-after": "7"})
    if mode == "error":
        return Response("Internal Server Error", status_code=500)
    if mode == "redirect":
        return Response(status_code=302, headers={"location": "http://169.254.169.254/latest/meta-data/"})
    if mode == "gzip":
        packed = gzip.compress(json.dumps(recorded("searxng_search.json")).encode())
        return Response(packed, headers={"content-encoding": "gzip"}, media_type="application/json")
    if mode == "forbidden":
        echo = {"query": dict(request.query_params), "headers": dict(request.headers), "body": body}
        return JSONResponse({"error": "forbidden", "echo": echo}, status_code=403)
    if mode == "markup":
        return JSONResponse(_markup_results())
    if mode == "unresponsive":
        answer = recorded("searxng_search.json")
        answer["results"] = []
        answer["unresponsive_engines"] = [["google", "CAPTCHA"], ["duckduckgo", "timeout"]]
        return JSONResponse(answer)
    if mode == "none":
        answer = recorded("searxng_search.json")
        answer["results"], answer["unresponsive_engines"] = [], []
        return JSONResponse(answer)
    if mode == "custom":
        return JSONResponse({"query": request.query_params.get("q", ""), "results": request.app.state.results})
    if mode == "empty":
        answer = recorded("brave_web_search.json")
        del answer["web"]
        return JSONResponse(answer)
    return Response("unknown mode", status_code=404)


def search_app() -> Starlette:
    app = Starlette(routes=[Route("/{mode}/{rest:path}", handle, methods=["GET", "POST"])])
    app.state.seen = []
    app.state.results = []
    return app
