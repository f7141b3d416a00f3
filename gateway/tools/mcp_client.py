"""The gateway's MCP client: list a remote server's tools, call one, in bounded time and bytes.

Why a wrapper around the official SDK (``mcp`` 2.x) rather than the SDK as is: the turn needs an
answer it can put in an ``mcp_list_tools`` or ``mcp_call`` item whatever the server does, and the
SDK's defaults are made for a trusted server: a 300 s read timeout, a JSON body read whole, a
call that lists the tools again to check its output schema, errors that name URLs. Here:

- **Time.** Every operation runs under one deadline (``list_timeout`` / ``call_timeout``) that
  covers connecting, the handshake, the request and closing: a server that accepts and never
  answers, or drips bytes forever, costs that long and no longer. Cancelling the caller closes the
  connection at once (the SDK's transports are anyio task groups inside the deadline's scope).
- **Bytes.** Everything one operation reads from the server is counted as it arrives and cut off
  past ``max_response_bytes`` (the body stream of each response is wrapped in a counting one, and
  the request asks for no content coding, so what is counted is what is decoded; a compressed
  answer anyway is refused). A tool's output is then cut to ``max_output_bytes`` at a UTF-8
  boundary with a marker that says how much was cut.
- **Faults are values.** :meth:`McpClient.call_tool` never raises for anything the server does
  (timeouts, refused connections, HTTP errors, malformed JSON-RPC, protocol errors): they become
  :attr:`ToolResult.error`, a message the model and the API client may read. :meth:`list_tools`
  raises :class:`McpError` with such a message (the turn reports ``mcp_list_tools`` failed). Only
  cancellation propagates.
- **Secrets.** An endpoint's headers (``Authorization``...) go with every request and nowhere
  else: not in reprs, not in messages (which name the server by its label, never its URL, which
  may carry a key in its query), and a header value a server echoes back in an error or an output
  is replaced by ``[redacted]`` before the gateway keeps or shows it.

**One session per operation.** Each list or call opens its own HTTP client and MCP session and
closes it (a DELETE ends a stateful server's session). That keeps a slow call from holding up
another, a broken session from poisoning the next call, and credentials from living in a pool;
it costs a handshake per call. The protocol era is negotiated by the SDK (``mode="auto"``: a
``server/discover`` probe, then the ``initialize`` handshake for servers that predate 2026-07-28).
Measured against the local test server (``tests/mcp_servers``, same process, 2 busy cores): a call
on its own session took 6.3 ms median (p90 8.3) with the discover probe and 5.0 ms (p90 6.4)
with the protocol learned (below), 12.3 ms over SSE (a GET stream and the handshake first),
against 2.2-2.7 ms for a call on a session kept open. Reusing sessions is a later optimization.

**Transports.** ``streamable_http`` (the current one), ``sse`` (the 2024-11-05 one, for older
servers) or ``auto``: SSE when the URL's path ends in ``/sse``, else Streamable HTTP, falling back
to SSE when the server answers the streamable POST with 404 or 405 before a session exists.

**Learned protocols.** What a server URL spoke the last time an operation on it succeeded is kept
(:attr:`McpClient.learned`, bounded): a 2026-07-28+ version (the next operation adopts it without
the ``server/discover`` probe: one request instead of two), ``legacy`` (the initialize handshake
at once, without the probe), or ``sse`` (no streamable POST first). A try on a learned protocol
that fails forgets it; a listing is then tried again the full way within the same deadline, a call
only when it cannot have run (the legacy handshake failed, or the server refused the request with
HTTP 400/404/405 or refused the protocol version), so a tool never runs twice for one call.

The HTTP client comes from ``http_factory`` (the SDK's ``McpHttpClientFactory`` shape:
``factory(headers=, timeout=, auth=) -> httpx2.AsyncClient``), so the outbound guard
(``security.outbound.mcp_client_factory``) decides which addresses may be reached.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
import msgspec
from mcp.client.client import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, McpHttpClientFactory
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, HEADER_MISMATCH, PARSE_ERROR, REQUEST_TIMEOUT, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from cache.lru import BoundedLRU
from security.outbound import OutboundRefused

__all__ = [
    "ErrorKind",
    "ListedTool",
    "McpClient",
    "McpEndpoint",
    "McpError",
    "ToolResult",
    "cut_utf8",
    "shared_tls_http_client",
]

T = TypeVar("T")

Transport = Literal["auto", "streamable_http", "sse"]
ErrorKind = Literal["tool", "http", "protocol"]

#: a header value shorter than this is not scrubbed from what a server sends back (too likely to
#: be a word of the output by chance: "1", "json"); credentials are longer
_MIN_SECRET = 8
#: how much of a server's own error message is kept
_MAX_SERVER_MESSAGE = 500
#: tools/list pages followed before the listing is called malformed (a paginator that never ends)
_MAX_PAGES = 32


class McpError(Exception):
    """A listing that failed. ``str()`` is safe to show an API client: it names the server by its
    label and says what went wrong (unreachable, an HTTP status, a timeout, a malformed answer),
    never a URL or a header value."""


class McpEndpoint(msgspec.Struct, frozen=True):
    """A remote MCP server as one request names it. ``headers`` are secret: sent on every request
    to the server, shown nowhere (``repr`` lists their names only); never encode an endpoint."""

    label: str
    url: str
    headers: Mapping[str, str] = msgspec.field(default_factory=dict)
    transport: Transport = "auto"

    def __repr__(self) -> str:
        names = ", ".join(sorted(self.headers))
        return f"McpEndpoint(label={self.label!r}, url={self.url!r}, headers=<{names}>, transport={self.transport!r})"

    __str__ = __repr__


class ListedTool(msgspec.Struct, frozen=True):
    """One tool a server lists, shaped as an entry of OpenAI's ``mcp_list_tools.tools``."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None

    def wire(self) -> dict[str, Any]:
        """The entry as the Responses API shows it (``McpListToolsTool``)."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
        }


class ToolResult(msgspec.Struct, frozen=True):
    """What one call came to: ``output`` (the tool's text, maybe cut) or ``error`` (the tool's own
    error text, or what went wrong reaching it). ``output_bytes``: the UTF-8 size of the output or
    error the tool produced, before any cut; ``elapsed``: seconds, connect to close.

    ``error_kind`` says whose fault an error is, for ``mcp_call.error``'s type: ``"tool"`` the tool
    reported it (``isError``), ``"http"`` the server could not be reached in time or answered an
    HTTP error (``http_status`` then), ``"protocol"`` its answer was not usable MCP (malformed,
    too large, a JSON-RPC error). None when there is no error."""

    output: str | None
    error: str | None
    output_bytes: int
    elapsed: float
    error_kind: ErrorKind | None = None
    http_status: int | None = None


def cut_utf8(text: str, limit: int) -> tuple[str, int]:
    """``text`` in at most ``limit`` UTF-8 bytes, a marker included when it had to be cut, and its
    size before: a cut falls on a character boundary and ends with ``[... N bytes cut]``."""
    data = text.encode("utf-8", "surrogatepass")
    size = len(data)
    if size <= limit:
        return text, size
    # the marker's bytes come out of the budget (its digits at most those of ``size``)
    keep = max(0, limit - len(f"\n[... {size} bytes cut]"))
    while keep and data[keep] & 0xC0 == 0x80:  # not inside a character: back to its first byte
        keep -= 1
    return data[:keep].decode("utf-8", "surrogatepass") + f"\n[... {size - keep} bytes cut]", size


class _Op:
    """What one operation saw on the wire, for a clear message whatever exception the SDK makes of
    it: the first HTTP error status, whether the body budget ran out, how many bytes came."""

    __slots__ = ("connected", "last_status", "received", "refused", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        #: the status of the latest response (whether the last request was refused as such)
        self.last_status: int | None = None
        self.received = 0
        self.refused: str | None = None
        self.connected = False


class _ResponseTooLarge(httpx2.ReadError):
    pass


class _CountedStream(httpx2.AsyncByteStream):
    """A response body that stops past the operation's byte budget (all its responses together)."""

    def __init__(self, inner: httpx2.AsyncByteStream, op: _Op, limit: int) -> None:
        self._inner = inner
        self._op = op
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._op.received += len(chunk)
            if self._op.received > self._limit:
                self._op.refused = f"sent more than {self._limit} bytes"
                raise _ResponseTooLarge("response too large")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    """The exceptions inside (nested) exception groups: the SDK's task groups wrap what failed."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


class _Scrub:
    """Replaces an endpoint's header values (and a credential after its scheme: ``Bearer X``'s X)
    in text a server sent back."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        secrets: set[str] = set()
        for value in headers.values():
            secrets.add(value)
            scheme, _, credential = value.partition(" ")
            if credential:
                secrets.add(credential.strip())
        self._secrets = sorted((s for s in secrets if len(s) >= _MIN_SECRET), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return text


_CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _describe(block: Any) -> str:
    """A short JSON descriptor for a content block that is not text (the model gets its kind and
    size, not a base64 payload)."""
    kind = getattr(block, "type", "unknown")
    if isinstance(block, types.ImageContent | types.AudioContent):
        return _json({"type": kind, "mime_type": block.mime_type, "bytes": len(block.data) * 3 // 4})
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        size = len(res.text) if isinstance(res, types.TextResourceContents) else len(res.blob) * 3 // 4
        return _json({"type": kind, "uri": str(res.uri), "mime_type": res.mime_type, "bytes": size})
    if isinstance(block, types.ResourceLink):
        return _json({"type": kind, "uri": str(block.uri), "name": block.name, "mime_type": block.mime_type})
    return _json({"type": kind})


def _result_text(result: types.CallToolResult) -> str:
    """The text contents joined by newlines, other blocks as descriptors, and the structured
    content as JSON when no block is text."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
            has_text = True
        else:
            parts.append(_describe(block))
    if not has_text and result.structured_content is not None:
        parts.insert(0, _json(result.structured_content))
    return "\n".join(parts)


def _listed(tool: types.Tool) -> ListedTool:
    annotations = None
    if tool.annotations is not None:
        annotations = tool.annotations.model_dump(by_alias=True, mode="json", exclude_none=True)
    return ListedTool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=annotations or None,
    )


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx2.create_ssl_context()


def shared_tls_http_client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """The SDK's ``create_mcp_http_client`` with one TLS context for every client: building a
    context loads the CA bundle (~25 ms measured, more than a whole local MCP call); sharing it
    costs nothing (an ``SSLContext`` may serve many connections)."""
    if timeout is None:
        timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    return httpx2.AsyncClient(
        headers=headers,
        timeout=timeout,
        auth=auth,
        verify=_tls(),
    )


def _not_run(exc: BaseException, op: _Op, pin: str) -> bool:
    """Whether a try on a learned protocol failed before the server could run the work: the
    handshake failed (``legacy``: the work is sent after it), or the server refused the request as
    such (an HTTP 400/404/405, or the protocol version refused), where a tool's own failure is a
    result. Only then is a call sent again."""
    if pin == "legacy":
        return not op.connected
    if op.last_status in (400, 404, 405):
        return True
    return any(isinstance(leaf, MCPError) and leaf.code == UNSUPPORTED_PROTOCOL_VERSION for leaf in _leaves(exc))


def _use_sse(endpoint: McpEndpoint) -> bool:
    if endpoint.transport != "auto":
        return endpoint.transport == "sse"
    return urlsplit(endpoint.url).path.rstrip("/").endswith("/sse")


class McpClient:
    """Lists and calls tools on remote MCP servers (see the module docstring). One instance serves
    every request: it holds no connection and no credential between operations."""

    def __init__(
        self,
        http_factory: McpHttpClientFactory | None = None,
        *,
        list_timeout: float = 15.0,
        call_timeout: float = 60.0,
        max_output_bytes: int = 256 * 1024,
        max_response_bytes: int = 4 * 1024 * 1024,
        max_tools: int = 1024,
        max_learned: int = 4096,
    ) -> None:
        """``http_factory``: makes the HTTP client of each operation (:func:`shared_tls_http_client`
        when None; the gateway passes the outbound guard's). ``max_response_bytes``: all an operation may
        read from the server; ``max_tools``: a longer listing is refused as malformed."""
        self._factory: McpHttpClientFactory = http_factory or shared_tls_http_client
        self.list_timeout = list_timeout
        self.call_timeout = call_timeout
        self.max_output_bytes = max_output_bytes
        self.max_response_bytes = max_response_bytes
        self.max_tools = max_tools
        #: what each server URL spoke the last time an operation succeeded: ``"legacy"`` (the
        #: initialize handshake), a 2026-07-28+ protocol version, or ``"sse"`` (see the module
        #: docstring, *Learned protocols*); a fact about the server, not a credential
        self.learned: BoundedLRU[str, str] = BoundedLRU(max_learned)

    async def list_tools(self, endpoint: McpEndpoint) -> tuple[ListedTool, ...]:
        """Every tool the server lists (all pages). Raises :class:`McpError` on any failure."""

        async def listing(client: Client) -> tuple[ListedTool, ...]:
            tools: list[ListedTool] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
                tools.extend(_listed(tool) for tool in page.tools)
                if len(tools) > self.max_tools:
                    raise _Refused(f"lists more than {self.max_tools} tools")
                cursor = page.next_cursor
                if not cursor:
                    return tuple(tools)
            raise _Refused(f"lists tools over more than {_MAX_PAGES} pages")

        try:
            return await self._run(endpoint, self.list_timeout, listing, idempotent=True)
        except _Failed as failed:
            raise McpError(f"Could not list the tools of MCP server '{endpoint.label}': {failed}") from None

    async def call_tool(self, endpoint: McpEndpoint, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool. Never raises for what the server does (see the module docstring); only
        cancellation propagates."""
        scrub = _Scrub(endpoint.headers)
        started = time.perf_counter()

        async def call(client: Client) -> types.CallToolResult | types.InputRequiredResult:
            request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
            # the session's own call_tool would list the tools again to check the output schema:
            # a second round trip per call, and a check the gateway does not need
            try:
                return await client.session.send_request(request, _CALL_RESULT)
            except MCPError as exc:
                if exc.code != HEADER_MISMATCH:
                    raise
            # a 2026-07-28 server whose tool mirrors arguments into Mcp-Param-* headers wants the
            # session to have listed it (the SDK derives the headers from the listing): list, resend
            await client.session.list_tools()
            return await client.session.send_request(request, _CALL_RESULT)

        try:
            result = await self._run(endpoint, self.call_timeout, call, idempotent=False)
        except _Failed as failed:
            text, size = cut_utf8(f"MCP server '{endpoint.label}': {failed}", self.max_output_bytes)
            return ToolResult(None, text, size, time.perf_counter() - started, failed.kind, failed.status)
        elapsed = time.perf_counter() - started
        if isinstance(result, types.InputRequiredResult):
            text = f"MCP server '{endpoint.label}': tool '{name}' asked for user input, which the gateway cannot give"
            return ToolResult(None, text, len(text), elapsed, "protocol")
        text, size = cut_utf8(scrub(_result_text(result)), self.max_output_bytes)
        if result.is_error:
            return ToolResult(None, text or f"tool '{name}' failed", size, elapsed, "tool")
        return ToolResult(text, None, size, elapsed)

    # --- one operation ----------------------------------------------------------------------------

    async def _run(
        self, endpoint: McpEndpoint, timeout: float, work: Callable[[Client], Awaitable[T]], *, idempotent: bool
    ) -> T:
        """``work`` on a fresh session, all of it within ``timeout``; what fails becomes
        :class:`_Failed` with a safe message. ``idempotent``: ``work`` may be sent twice (a listing)."""
        scrub = _Scrub(endpoint.headers)
        ops: list[_Op] = []
        try:
            with anyio.fail_after(timeout):
                return await self._attempts(endpoint, timeout, work, idempotent, ops)
        except Exception as exc:
            refused = next((leaf for leaf in _leaves(exc) if isinstance(leaf, _Refused)), None)
            if refused is not None:
                raise _Failed(str(refused), "protocol") from None
            failed = self._explain(exc, ops[-1] if ops else _Op(), timeout)
            raise _Failed(scrub(str(failed)), failed.kind, failed.status) from None

    async def _attempts(
        self,
        endpoint: McpEndpoint,
        timeout: float,
        work: Callable[[Client], Awaitable[T]],
        idempotent: bool,
        ops: list[_Op],
    ) -> T:
        """The transport and protocol to try, from the endpoint and what the server spoke last time
        (``learned``); a second try only where the first cannot have run the work."""
        url = endpoint.url
        known = self.learned.get(url) if endpoint.transport == "auto" else None
        if _use_sse(endpoint) or known == "sse":
            ops.append(_Op())
            try:
                return await self._session(endpoint, ops[-1], timeout, work, sse=True, pin=None)
            except Exception:
                if known != "sse" or ops[-1].connected:
                    raise
                self.learned.pop(url)  # no longer an SSE server, it seems: find out again
            known = None
        ops.append(_Op())
        try:
            return await self._session(endpoint, ops[-1], timeout, work, sse=False, pin=known)
        except Exception as exc:
            op = ops[-1]
            if known is not None:
                self.learned.pop(url)
                if idempotent or _not_run(exc, op, known):
                    return await self._attempts(endpoint, timeout, work, idempotent, ops)
                raise
            if endpoint.transport != "auto" or op.connected or op.status not in (404, 405):
                raise
        ops.append(_Op())  # an SSE-only server: its answer to the streamable POST was 404/405
        result = await self._session(endpoint, ops[-1], timeout, work, sse=True, pin=None)
        self.learned.put(url, "sse")
        return result

    async def _session(
        self,
        endpoint: McpEndpoint,
        op: _Op,
        timeout: float,
        work: Callable[[Client], Awaitable[T]],
        *,
        sse: bool,
        pin: str | None,
    ) -> T:
        headers = {**endpoint.headers, "accept-encoding": "identity"}
        transport: AbstractAsyncContextManager[Any]
        if sse:
            transport = sse_client(
                endpoint.url,
                headers=headers,
                timeout=timeout,
                sse_read_timeout=timeout,
                httpx_client_factory=self._counted_factory(op),
            )
            # the SSE transport predates server/discover: the initialize handshake
            async with Client(transport, mode="legacy", cache=None) as client:
                op.connected = True
                return await work(client)
        async with self._counted_factory(op)(headers=headers, timeout=httpx2.Timeout(timeout)) as http:
            transport = streamable_http_client(endpoint.url, http_client=http)
            async with Client(transport, mode=pin or "auto", cache=None) as client:
                op.connected = True
                result = await work(client)
                version = client.protocol_version
                if pin is None:
                    self.learned.put(endpoint.url, version if version in MODERN_PROTOCOL_VERSIONS else "legacy")
                return result

    def _counted_factory(self, op: _Op) -> McpHttpClientFactory:
        """``http_factory`` with the operation's bookkeeping hooked in: the first error status, and
        each response body counted against the byte budget (a coded body refused)."""
        limit = self.max_response_bytes

        async def on_response(response: httpx2.Response) -> None:
            if response.status_code >= 400 and op.status is None:
                op.status = response.status_code
            op.last_status = response.status_code
            coding = response.headers.get("content-encoding", "identity").strip().lower()
            if coding not in ("", "identity"):
                op.refused = f"sent a {coding}-coded body though none was asked for"
                raise _ResponseTooLarge("coded body")
            if isinstance(response.stream, httpx2.AsyncByteStream):  # always, from an async client
                response.stream = _CountedStream(response.stream, op, limit)

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            client = self._factory(headers=headers, timeout=timeout, auth=auth)
            client.event_hooks["response"].append(on_response)
            return client

        return factory

    @staticmethod
    def _explain(exc: BaseException, op: _Op, timeout: float) -> _Failed:
        """What went wrong, in words an API client may read, and its kind (see :class:`ToolResult`)."""
        if isinstance(exc, TimeoutError):
            return _Failed(f"no answer within {timeout:g} s", "http")
        if op.refused is not None:
            return _Failed(op.refused, "protocol")
        if op.status is not None:
            return _Failed(f"the server answered HTTP {op.status}", "http", op.status)
        leaves = list(_leaves(exc))
        for leaf in leaves:
            if isinstance(leaf, OutboundRefused):  # its message is written to be shown
                return _Failed(str(leaf), "http")
            if isinstance(leaf, httpx2.HTTPStatusError):
                status = leaf.response.status_code
                return _Failed(f"the server answered HTTP {status}", "http", status)
        for leaf in leaves:
            if isinstance(leaf, httpx2.TimeoutException):
                return _Failed(f"no answer within {timeout:g} s", "http")
            if isinstance(leaf, httpx2.ConnectError | ConnectionError):
                return _Failed("the server could not be reached", "http")
            if isinstance(leaf, httpx2.UnsupportedProtocol | httpx2.InvalidURL | OverflowError):
                return _Failed("the server URL is not a valid http(s) URL", "http")
            if isinstance(leaf, httpx2.LocalProtocolError | UnicodeEncodeError):  # refused before sending
                return _Failed("a header name or value is not valid in HTTP", "protocol")
            if isinstance(leaf, httpx2.TransportError):
                return _Failed("the connection to the server failed", "http")
        for leaf in leaves:
            if isinstance(leaf, MCPError):
                # the transport makes some of these itself, from what it could not read
                if leaf.code == PARSE_ERROR:
                    return _Failed("the server's answer is not valid JSON-RPC", "protocol")
                if leaf.code == REQUEST_TIMEOUT:
                    return _Failed(f"no answer within {timeout:g} s", "http")
                if leaf.code == CONNECTION_CLOSED:
                    return _Failed("the server closed the connection without an answer", "protocol")
                if leaf.message.startswith("Unexpected content type"):
                    return _Failed("the server answered with a content type that is neither JSON nor SSE", "protocol")
                return _Failed(f"the server answered with an error: {leaf.message[:_MAX_SERVER_MESSAGE]}", "protocol")
            if isinstance(leaf, ValidationError | ValueError):
                return _Failed("the server's answer is malformed", "protocol")
        name = type(leaves[0] if leaves else exc).__name__
        return _Failed(f"the exchange with the server failed ({name})", "protocol")


class _Refused(Exception):
    """The gateway refuses what the server answered (too many tools or pages); the text says why."""


class _Failed(Exception):
    """An operation that failed: its safe message, its kind and the HTTP status if there was one."""

    def __init__(self, message: str, kind: ErrorKind, status: int | None = None) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.status = status
