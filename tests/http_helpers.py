"""Helpers shared by the HTTP/SSE test files: strict SSE parsing, raw posts, error-body checks.

The SSE parser is deliberately strict (it is part of what the tests check): every frame must be
exactly ``event: <type>\\n`` + ``data: <json>\\n`` + ``\\n`` with LF line endings, the event name must
equal ``data.type``, and there is no ``[DONE]`` sentinel.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import MODEL, LiveGateway

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """Strictly parse a Responses SSE body into event dicts (asserting the framing)."""
    assert b"\r" not in raw, "SSE must use LF line endings only"
    assert raw.endswith(b"\n\n"), "the stream must end with a complete frame"
    assert b"[DONE]" not in raw, "Responses streams never send [DONE]"
    events: list[dict[str, Any]] = []
    for frame in raw[:-2].split(b"\n\n"):
        lines = frame.split(b"\n")
        assert len(lines) == 2, f"frame must be exactly 'event:' + 'data:' lines: {frame[:200]!r}"
        assert lines[0].startswith(b"event: "), lines[0]
        assert lines[1].startswith(b"data: "), lines[1][:200]
        name = lines[0][len(b"event: ") :].decode()
        data = json.loads(lines[1][len(b"data: ") :])
        assert isinstance(data, dict)
        assert data.get("type") == name, f"event name {name!r} != data.type {data.get('type')!r}"
        events.append(data)
    return events


def post(
    live: LiveGateway,
    body: Any,
    *,
    path: str = "/responses",
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> httpx.Response:
    """POST a JSON body (or raw bytes) and return the response."""
    hdrs = {"content-type": "application/json", **(headers or {})}
    content = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    return httpx.post(live.base_url + path, content=content, headers=hdrs, timeout=timeout)


def create(live: LiveGateway, **fields: Any) -> dict[str, Any]:
    """Non-streaming create via raw HTTP; asserts 200 and returns the Response JSON."""
    fields.setdefault("model", MODEL)
    r = post(live, fields)
    assert r.status_code == 200, r.text
    return r.json()


def stream(live: LiveGateway, **fields: Any) -> tuple[httpx.Response, bytes, list[dict[str, Any]]]:
    """Streaming create via raw HTTP: (response, raw body, parsed events)."""
    fields.setdefault("model", MODEL)
    fields["stream"] = True
    with httpx.stream("POST", live.base_url + "/responses", json=fields, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200, raw[:500]
    return r, raw, parse_sse(raw)


def assert_error(
    r: httpx.Response,
    status: int,
    *,
    code: Any = "<any>",
    param: Any = "<any>",
    type_: str = "invalid_request_error",
    message: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-shaped error: JSON content type and ``{"error": {message, type, param, code}}``."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == type_, err
    if code != "<any>":
        assert err["code"] == code, err
    if param != "<any>":
        assert err["param"] == param, err
    if message is not None:
        assert err["message"] == message, err
    return err


def assert_still_serving(live: LiveGateway) -> None:
    """After a rejected request the server keeps answering normal ones."""
    r = post(live, {"model": MODEL, "input": "still there?"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Bounded polling (a safety net against hangs, not a timing assertion): the predicate's first
    truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def output_types(response: dict[str, Any]) -> list[str]:
    return [o["type"] for o in response["output"]]


def message_text(response: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "")
        for o in response["output"]
        if o["type"] == "message"
        for p in o["content"]
        if p["type"] == "output_text"
    )
