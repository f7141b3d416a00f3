"""A near-instant upstream for a gateway that calls vLLM's stateless ``/v1/responses``.

agentic-api (:mod:`benchmarks.agentic_peer`) owns conversation state and sends each turn's whole
history to vLLM's own Responses API (``"stream":true``, no ``store`` field), which tokenizes and
generates. To measure *its* per-turn cost the way the simulated engine measures respgate's, this
server stands where vLLM would and answers at once with a fixed short completion, in the wire
shape vLLM's server streams: ``event:``/``data:`` SSE frames, ``response.created`` and
``response.in_progress``, then per output item ``output_item.added`` / ``content_part.added`` /
deltas / ``…text.done`` / ``content_part.done`` / ``output_item.done``, and ``response.completed``
— which vLLM sends with ``status: "incomplete"`` when ``max_output_tokens`` cut the answer off.

The answer mirrors the simulated engine's ``short`` script (a reasoning item ``ok``, then a message
``done``). A request with ``max_output_tokens`` gets that many one-token text deltas and ends
incomplete, as the simulated engine's endless ``stream`` script does under a cap.

Cheap by construction: every answer is rendered once per (streaming, cap) into bytes with its ids
as one placeholder; a request costs reading its body, two ``bytes.find`` for ``"stream":true`` and
``max_output_tokens`` (no JSON parse), one ``bytes.replace`` and one ``write``. The SSE body goes out
with a ``Content-Length`` in a single write — a finished stream, as from an engine that has
already generated. HTTP/1.1 keep-alive; request bodies with ``Content-Length`` or chunked.

``GET /stats`` answers the counters (requests and body bytes per path, and the stub's own busy time),
so a benchmark can state what the gateway sent upstream per turn and what the stand-in itself cost;
``GET /health`` and ``GET /v1/models`` answer as vLLM's do.

    python -m benchmarks.upstream_stub --port P [--model gpt-oss-sim]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from typing import Any

import orjson

_ID = b"@N@"
_HEAD_MAX = 64 * 1024


def _response(
    model: str, *, status: str, output: list[dict[str, Any]], cap: int | None, output_tokens: int | None
) -> dict[str, Any]:
    """The response object vLLM's ``ResponsesResponse.from_request`` serializes (all its fields)."""
    usage = (
        None
        if output_tokens is None
        else {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": output_tokens,
        }
    )
    return {
        "id": "resp_@N@",
        "created_at": 0,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "metadata": None,
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": cap or 4096,
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "input_messages": None,
        "output_messages": None,
    }


def _items(cap: int | None) -> list[tuple[str, str, list[str]]]:
    """(kind, id, deltas) per output item: the short answer, or ``cap`` tokens of a cut-off message."""
    if cap is not None:
        return [("message", "msg_@N@", [" lorem"] * cap)]
    return [("reasoning", "rs_@N@", ["ok"]), ("message", "msg_@N@", ["done"])]


def events(model: str, cap: int | None) -> list[dict[str, Any]]:
    """The event sequence vLLM's server streams for this answer (``sequence_number`` filled in)."""
    items = _items(cap)
    incomplete = cap is not None
    tokens = sum(len(d) for _, _, d in items)
    start = _response(model, status="in_progress", output=[], cap=cap, output_tokens=None)
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    done_items = []
    for index, (kind, item_id, deltas) in enumerate(items):
        text = "".join(deltas)
        if kind == "reasoning":
            part_type, delta_type, done_type = (
                "reasoning_text",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
            )
            open_item = {
                "id": item_id,
                "summary": [],
                "type": "reasoning",
                "content": None,
                "encrypted_content": None,
                "status": "in_progress",
            }
            part = {"text": text, "type": "reasoning_text"}
            done_item = {**open_item, "content": [part], "status": "completed"}
        else:
            part_type, delta_type, done_type = "output_text", "response.output_text.delta", "response.output_text.done"
            open_item = {"id": item_id, "content": [], "role": "assistant", "status": "in_progress", "type": "message"}
            part = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
            done_item = {**open_item, "content": [part], "status": "incomplete" if incomplete else "completed"}
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        empty = {"text": "", "type": part_type, **({"annotations": [], "logprobs": []} if kind == "message" else {})}
        out += [
            {"type": "response.output_item.added", "output_index": index, "item": open_item},
            {"type": "response.content_part.added", **where, "part": empty},
        ]
        for d in deltas:
            out.append({"type": delta_type, **where, "delta": d, **({"logprobs": []} if kind == "message" else {})})
        out += [
            {"type": done_type, **where, "text": text, **({"logprobs": []} if kind == "message" else {})},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": done_item},
        ]
        done_items.append(done_item)
    final = _response(
        model, status="incomplete" if incomplete else "completed", output=done_items, cap=cap, output_tokens=tokens
    )
    out.append({"type": "response.completed", "response": final})
    for n, ev in enumerate(out):
        ev["sequence_number"] = n
    return out


@functools.lru_cache(maxsize=64)
def rendered(model: str, stream: bool, cap: int | None) -> bytes:
    """The whole HTTP response for one answer, ids as :data:`_ID` (rendered once per key)."""
    evs = events(model, cap)
    if stream:
        body = b"".join(b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n" for ev in evs)
        ctype = b"text/event-stream"
    else:
        body = orjson.dumps(evs[-1]["response"])
        ctype = b"application/json"
    # the id placeholder is 3 bytes; every id the counter writes is 12 digits
    length = len(body) + body.count(_ID) * 9
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: "
        + ctype
        + b"\r\ncontent-length: "
        + str(length).encode()
        + b"\r\n\r\n"
        + body
    )


def _plain(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: ".encode()
        + ctype
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def parse_cap(body: bytes | bytearray) -> int | None:
    """``max_output_tokens`` of a JSON request body, without parsing it (``None``: absent or null)."""
    i = body.find(b'"max_output_tokens":')
    if i < 0:
        return None
    j = i + len(b'"max_output_tokens":')
    while j < len(body) and body[j] in b" \t":
        j += 1
    k = j
    while k < len(body) and 48 <= body[k] <= 57:
        k += 1
    return int(body[j:k]) if k > j else None


class Stats:
    """Requests and body bytes per ``METHOD path``, and the stub's own busy time (``busy_s``: inside
    its read/answer callback), so a benchmark can subtract what the stand-in itself cost."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.body_bytes: dict[str, int] = {}
        self.busy_s = 0.0

    def count(self, path: str, size: int) -> None:
        self.requests[path] = self.requests.get(path, 0) + 1
        self.body_bytes[path] = self.body_bytes.get(path, 0) + size

    def json(self) -> bytes:
        return orjson.dumps({"requests": self.requests, "body_bytes": self.body_bytes, "busy_s": self.busy_s})


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: read a request whole, answer it in one write.

    The head is parsed once per request (a 600 KB body arrives in dozens of reads); a
    ``Content-Length`` body is handed on as the buffer itself, not copied.
    """

    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.head: tuple[str, str, int | None] | None = None  # method, path, length (None: chunked)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t0 = time.perf_counter()
        self.buf += data
        while self.transport is not None and not self.transport.is_closing():
            if not self._one():
                break
        self.server.stats.busy_s += time.perf_counter() - t0

    def _one(self) -> bool:
        """Answer one complete request from the buffer; ``False`` while it is incomplete."""
        if self.head is None and not self._parse_head():
            return False
        assert self.head is not None
        method, path, size = self.head
        if size is None:
            got = _dechunk(self.buf, 0)
            if got is None:
                return False
            body, consumed = got
            del self.buf[:consumed]
        elif len(self.buf) < size:
            return False
        elif len(self.buf) == size:
            body, self.buf = self.buf, bytearray()
        else:  # a pipelined request behind this one
            body = self.buf[:size]
            del self.buf[:size]
        self.head = None
        self.server.stats.count(f"{method} {path}", len(body))
        self.transport.write(self.server.answer(method, path, body))  # type: ignore[union-attr]
        return True

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > _HEAD_MAX:
                self._fail(b"431 Request Header Fields Too Large")
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, _ = lines[0].split(" ", 2)
        except ValueError:
            self._fail(b"400 Bad Request")
            return False
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.head = (method, target.split("?", 1)[0], None if chunked else int(headers.get("content-length") or 0))
        del self.buf[: end + 4]
        return True

    def _fail(self, status: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_plain(status.decode(), b"{}"))
        self.transport.close()


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    out = bytearray()
    i = start
    while True:
        nl = buf.find(b"\r\n", i)
        if nl < 0:
            return None
        size = int(bytes(buf[i:nl]).split(b";", 1)[0], 16)
        if size == 0:
            trailer = buf.find(b"\r\n\r\n", nl)
            if buf[nl : nl + 4] == b"\r\n\r\n":
                return bytes(out), nl + 4
            return (bytes(out), trailer + 4) if trailer >= 0 else None
        if len(buf) < nl + 2 + size + 2:
            return None
        out += buf[nl + 2 : nl + 2 + size]
        i = nl + 2 + size + 2


class StubServer:
    def __init__(self, model: str) -> None:
        self.model = model
        self.stats = Stats()
        self.counter = 0
        self.models = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": model,
                        "parent": None,
                        "max_model_len": 1_000_000,
                        "permission": [],
                    }
                ],
            }
        )

    def answer(self, method: str, path: str, body: bytes | bytearray) -> bytes:
        if method == "POST" and path == "/v1/responses":
            self.counter += 1
            stream = b'"stream":true' in body or b'"stream": true' in body
            return rendered(self.model, stream, parse_cap(body)).replace(_ID, b"%012d" % self.counter)
        if method == "GET" and path in ("/health", "/ping"):
            return _plain("200 OK", b"")
        if method == "GET" and path == "/v1/models":
            return _plain("200 OK", self.models)
        if method == "GET" and path == "/stats":
            return _plain("200 OK", self.stats.json())
        return _plain("404 Not Found", orjson.dumps({"error": {"message": f"stub: no {method} {path}"}}))


async def serve(port: int, model: str, host: str = "127.0.0.1") -> None:
    server = StubServer(model)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Conn(server), host, port, backlog=1024)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="gpt-oss-sim")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.port, args.model))
    except ImportError:
        asyncio.run(serve(args.port, args.model))


if __name__ == "__main__":
    main()
