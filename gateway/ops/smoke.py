"""``respgate smoke BASE_URL --api-key KEY``: what an operator runs after ``docker compose up``.

Four checks against any running deployment, made the way a client makes them, each printed as one
row of a pass/fail table:

``http``
    ``POST /v1/responses`` (JSON) reaches a terminal status with some output.
``sse``
    the same with ``stream: true``: the first event is ``response.created``, the last
    ``response.completed`` (or ``.incomplete``), sequence numbers strictly increase.
``websocket``
    two ``response.create`` frames on one socket, the second chained by ``previous_response_id``
    with only its new item (``store: false``, so the state lives on the connection). It passes
    only when the second turn reports ``cached_tokens > 0``: the engine's prefix cache reused the
    first turn. That is the check a split deployment fails when vLLM runs without
    ``--enable-prompt-tokens-details`` (it then reports no cache hits at all).
``tool``
    a function tool with ``tool_choice: "required"`` yields a ``function_call``, and its
    ``function_call_output`` in the next turn completes the loop.

Only the base dependencies are used (httpx, websockets), so the command runs from any install of
respgate, on the host or in its container. Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
INSTRUCTIONS = (
    "You are the assistant of an operator checking a fresh deployment. Answer every question in "
    "one short sentence, in English, without lists."
)


@dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str


class SmokeFailure(Exception):
    """A check's reason to fail (the message is its table row's detail)."""


def add_smoke_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], formatter: type[argparse.HelpFormatter]
) -> None:
    smoke = sub.add_parser(
        "smoke",
        formatter_class=formatter,
        help="check a running deployment: HTTP, SSE, WebSocket chain, tool call",
        description="Run an HTTP turn, an SSE turn, a WebSocket chain (the second turn must report cached_tokens) "
        "and a tool call against a running gateway, and print a pass/fail table. Exit status 1 "
        "when any check fails.",
    )
    smoke.add_argument("base_url", metavar="BASE_URL", help="the gateway, e.g. http://HOST:8000 (or .../v1)")
    smoke.add_argument(
        "--api-key", default=None, help="bearer key (default: $RESPGATE_API_KEY, else none: a gateway in open mode)"
    )
    smoke.add_argument("--model", default=None, help="served model name (default: the first of GET /v1/models)")
    smoke.add_argument("--max-output-tokens", type=int, default=64, help="output cap of each turn")
    smoke.add_argument("--timeout", type=float, default=180.0, help="seconds each check may take")


def run_smoke(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import os

    out = out or sys.stdout
    key = args.api_key or os.environ.get("RESPGATE_API_KEY")
    smoke = Smoke(args.base_url, key, model=args.model, max_output_tokens=args.max_output_tokens, timeout=args.timeout)
    checks = smoke.run()
    print_table(checks, out, header=f"respgate smoke {smoke.base} (model {smoke.model or '?'})")
    return 0 if all(c.ok for c in checks) else 1


def print_table(checks: list[Check], out: TextIO, header: str = "") -> None:
    if header:
        print(header, file=out)
    print(f"{'check':10} {'result':6} {'time':>8}  detail", file=out)
    for c in checks:
        print(f"{c.name:10} {'pass' if c.ok else 'FAIL':6} {c.seconds:7.2f}s  {c.detail}", file=out)
    failed = sum(not c.ok for c in checks)
    print(f"smoke: {len(checks) - failed} passed, {failed} failed", file=out)
    out.flush()


class Smoke:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        model: str | None = None,
        max_output_tokens: int = 64,
        timeout: float = 180.0,
    ) -> None:
        self.base = _api_base(base_url)
        self.key = api_key
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=self.headers, timeout=timeout)

    def run(self) -> list[Check]:
        try:
            try:
                self.model = self.model or self._first_model()
            except SmokeFailure as exc:
                return [Check(name, False, 0.0, str(exc)) for name in ("http", "sse", "websocket", "tool")]
            return [
                self._timed(name, step)
                for name, step in (
                    ("http", self.http_turn),
                    ("sse", self.sse_turn),
                    ("websocket", self.ws_chain),
                    ("tool", self.tool_call),
                )
            ]
        finally:
            self.client.close()

    # -- checks ---------------------------------------------------------------------------------

    def http_turn(self) -> str:
        body = self._post({"input": "Say hello to the operator.", "store": False})
        status = body.get("status")
        if status not in ("completed", "incomplete"):
            raise SmokeFailure(f"status {status}: {_error_text(body)}")
        usage = body.get("usage") or {}
        return f"{status}, {usage.get('output_tokens', '?')} output tokens: {_snippet(_output_text(body))}"

    def sse_turn(self) -> str:
        request = self._request({"input": "Name one planet.", "store": False, "stream": True})
        events: list[dict[str, Any]] = []
        with self.client.stream("POST", self.base + "/responses", json=request) as r:
            if r.status_code != 200:
                r.read()
                raise SmokeFailure(f"HTTP {r.status_code}: {_error_text(_json_or_text(r))}")
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                raise SmokeFailure(f"content-type {r.headers.get('content-type')!r}, not text/event-stream")
            name = None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[5:])
                    if name is not None and data.get("type") != name:
                        raise SmokeFailure(f"event: {name} carries data of type {data.get('type')}")
                    events.append(data)
                    if data.get("type") in TERMINAL:
                        break
        if not events:
            raise SmokeFailure("no events")
        types = [e.get("type") for e in events]
        seq = [e.get("sequence_number") for e in events]
        if types[0] != "response.created":
            raise SmokeFailure(f"first event {types[0]}, expected response.created")
        if types[-1] not in ("response.completed", "response.incomplete"):
            raise SmokeFailure(f"last event {types[-1]}: {_error_text(events[-1].get('response') or {})}")
        numbers = [s for s in seq if isinstance(s, int)]
        if len(numbers) != len(seq) or numbers != sorted(set(numbers)):
            raise SmokeFailure(f"sequence numbers are not strictly increasing: {seq[:8]}...")
        return f"{len(events)} events, {types[0]} .. {types[-1]}"

    def ws_chain(self) -> str:
        with self._ws() as ws:
            first = self._ws_turn(ws, {"input": "What is the capital of France?", "store": False})
            second = self._ws_turn(ws, {"input": "And of Italy?", "store": False, "previous_response_id": first["id"]})
        usage = second.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        if cached <= 0:
            raise SmokeFailure(
                f"second turn reports cached_tokens {cached} of {usage.get('input_tokens')} input "
                "tokens: the engine's prefix cache was not reused (split deployment: start vLLM "
                "with --enable-prompt-tokens-details and prefix caching on)"
            )
        return f"2 chained turns, cached_tokens {cached} of {usage.get('input_tokens')} input tokens"

    def tool_call(self) -> str:
        with self._ws() as ws:
            first = self._ws_turn(
                ws,
                {
                    "input": "What is the weather in Paris? Use the tool.",
                    "store": False,
                    "tools": [TOOL],
                    "tool_choice": "required",
                },
            )
            calls = [i for i in first.get("output", []) if i.get("type") == "function_call"]
            if not calls:
                kinds = [i.get("type") for i in first.get("output", [])]
                raise SmokeFailure(f"tool_choice=required gave no function_call (output: {kinds})")
            call = calls[0]
            try:
                arguments = json.loads(call.get("arguments") or "")
            except ValueError:
                raise SmokeFailure(
                    f"{call.get('name')} called with arguments that are not JSON: "
                    f"{_snippet(call.get('arguments') or '')}"
                ) from None
            second = self._ws_turn(
                ws,
                {
                    "input": [
                        {
                            "type": "function_call_output",
                            "call_id": call["call_id"],
                            "output": json.dumps({"city": arguments.get("city"), "weather": "sunny, 21C"}),
                        }
                    ],
                    "store": False,
                    "tools": [TOOL],
                    "previous_response_id": first["id"],
                },
            )
        return f"{call.get('name')}({json.dumps(arguments, ensure_ascii=False)}) -> output -> {second.get('status')}"

    # -- plumbing -------------------------------------------------------------------------------

    def _timed(self, name: str, step: Callable[[], str]) -> Check:
        t0 = time.monotonic()
        try:
            detail = step()
            ok = True
        except SmokeFailure as exc:
            ok, detail = False, str(exc)
        except Exception as exc:  # a dropped connection, a timeout, a malformed frame: this check failed
            ok, detail = False, f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'no detail'}"
        return Check(name, ok, time.monotonic() - t0, detail)

    def _first_model(self) -> str:
        try:
            r = self.client.get(self.base + "/models")
        except httpx.HTTPError as exc:
            raise SmokeFailure(f"cannot reach {self.base}: {type(exc).__name__}: {exc}") from None
        if r.status_code == 401:
            raise SmokeFailure("GET /v1/models answered 401: the gateway wants an API key (--api-key)")
        if r.status_code != 200:
            raise SmokeFailure(f"GET /v1/models answered {r.status_code}: {_error_text(_json_or_text(r))}")
        models = [m["id"] for m in r.json().get("data", [])]
        if not models:
            raise SmokeFailure("GET /v1/models lists no model")
        first: str = models[0]
        return first

    def _request(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": self.model,
            "instructions": INSTRUCTIONS,
            "max_output_tokens": self.max_output_tokens,
            **fields,
        }

    def _post(self, fields: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post(self.base + "/responses", json=self._request(fields))
        body = _json_or_text(r)
        if r.status_code != 200:
            raise SmokeFailure(f"HTTP {r.status_code}: {_error_text(body)}")
        response: dict[str, Any] = body
        return response

    def _ws(self) -> Any:
        from websockets.sync.client import connect

        return connect(
            _ws_url(self.base),
            additional_headers=self.headers,
            max_size=None,
            open_timeout=self.timeout,
            close_timeout=5,
        )

    def _ws_turn(self, ws: Any, fields: dict[str, Any]) -> dict[str, Any]:
        ws.send(json.dumps({"type": "response.create", **self._request(fields)}))
        deadline = time.monotonic() + self.timeout
        while True:
            event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            kind = event.get("type")
            if kind == "error":
                raise SmokeFailure(f"error event: {_error_text(event)}")
            if kind in TERMINAL:
                response = event["response"]
                if kind == "response.failed":
                    raise SmokeFailure(f"response.failed: {_error_text(response)}")
                final: dict[str, Any] = response
                return final


def _api_base(url: str) -> str:
    """``http://h:8000``, ``http://h:8000/`` and ``http://h:8000/v1`` all mean ``http://h:8000/v1``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def _ws_url(base: str) -> str:
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit(parts._replace(scheme=scheme, path=parts.path + "/responses"))


def _json_or_text(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def _error_text(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error") or body.get("incomplete_details")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("reason") or err)
        if err:
            return str(err)
    return _snippet(str(body), 160)


def _output_text(body: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in body.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    )


def _snippet(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
