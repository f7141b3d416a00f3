"""Outbound HTTP that a request cannot point at the gateway's own network (no SSRF).

The gateway calls remote MCP servers (and later web pages) whose URLs come from API requests. A URL
such as ``http://169.254.169.254/latest/meta-data/`` or ``http://localhost:6379/`` would turn the
gateway into the requester's proxy into its own network. So every connection an outbound client
opens goes through one check, made where it cannot be dodged:

* **On the resolved address, at connect time.** The check lives in the httpcore *network backend*
  (``connect_tcp``), so it sees every TCP connection the client opens: the first one, one per
  redirect hop (``follow_redirects`` or the MCP SDK's own within-origin following), and every new
  pooled connection. Checking the URL before the request would miss redirects and DNS.
* **Every address a name resolves to.** A name that resolves to a public and a private address is
  refused: which one the connection would use is not the requester's choice to make.
* **Pinned.** The backend resolves the name itself, checks the addresses, and connects to exactly
  the checked IP literal; nothing resolves the name a second time, so a DNS answer that changes
  between check and connect (DNS rebinding) cannot slip a private address in.
* **TLS still verifies the URL's host.** httpcore calls ``start_tls`` on the returned stream with
  ``server_hostname`` = the URL's host (``AsyncHTTPConnection._connect``), so SNI and the certificate
  check use the name, not the IP literal the socket was opened to.
* **Bounded responses.** Each response body read through the client is cut at
  ``max_response_bytes`` (a declared ``Content-Length`` over it is refused before reading), so an
  endless answer costs bounded memory. The client asks for ``Accept-Encoding: identity`` and refuses
  a compressed answer, because the bound counts bytes on the wire and a gzip bomb would multiply them
  a thousandfold after httpx decodes it.

Blocked: loopback, private (RFC 1918, ULA), shared (100.64/10), link-local, multicast, unspecified,
reserved and other special-purpose ranges, cloud metadata addresses, and the IPv6 forms that carry
an IPv4 address (``::ffff:127.0.0.1``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``), judged by the
address they carry. An operator exempts networks with ``OutboundPolicy.allow_networks`` (an
in-cluster MCP server on ``10.1.2.0/24``; ``127.0.0.0/8`` in tests).

Two HTTP stacks are served: ``httpx``/``httpcore`` (``guarded_client``, the gateway's own calls)
and ``httpx2``/``httpcore2``, which the ``mcp`` SDK 2.x uses (``mcp_client_factory``). The same
``_Guard`` does the work for both; each stack gets a thin backend and transport class.

Refusals raise ``OutboundRefused`` (``ResponseTooLarge`` for the size bound). Its message names the
host and the reason and nothing else (no headers, no credentials, no URL path or query), so it is
safe to show to the API client. Proxies from the environment are never used (``trust_env=False``):
a proxy would open the final connection where this check cannot see it.

**URLs stay out of the logs.** httpx logs each request's full URL (``HTTP Request: GET ...``, at
INFO, so under ``log_level: debug``); a ``guarded_client``'s URLs are requesters' data (pages the
model opened, a search query in a query string), so its lines show ``[url withheld]`` instead.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import anyio
import httpcore
import httpcore2
import httpx
import httpx2

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Blocked",
    "McpClientFactory",
    "OutboundPolicy",
    "OutboundRefused",
    "Resolver",
    "ResponseTooLarge",
    "classify_address",
    "find_refusal",
    "guarded_client",
    "mcp_client_factory",
    "parse_address",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: ``resolver(host, port)`` -> the IP literals ``host`` resolves to (the default: the system resolver,
#: through ``anyio.getaddrinfo``). A hook so tests can answer differently on successive lookups.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

#: the MCP SDK's own defaults (mcp.shared._httpx_utils): a server may hold an event stream open
_MCP_TIMEOUT_S = 30.0
_MCP_SSE_READ_TIMEOUT_S = 300.0


class Blocked(StrEnum):
    """Why an address is not reachable by default (the value is the word used in messages)."""

    CLOUD_METADATA = "cloud metadata"
    UNSPECIFIED = "unspecified"
    LOOPBACK = "loopback"
    LINK_LOCAL = "link-local"
    MULTICAST = "multicast"
    PRIVATE = "private"
    SHARED = "shared (carrier-grade NAT)"
    SITE_LOCAL = "site-local"
    RESERVED = "reserved"
    SPECIAL_PURPOSE = "special-purpose"


#: instance metadata services. Most sit in link-local space anyway; they are named first so the
#: message says what the address is, and so the two outside special ranges are blocked at all
#: (Azure's 168.63.129.16 is a public address; Alibaba's 100.100.100.200 is in the shared range).
_CLOUD_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer
    )
)
_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")
_PRIVATE_V4 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_ULA_V6 = ipaddress.IPv6Network("fc00::/7")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the last 32 bits are the IPv4 address
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local-use NAT64, an operator's own
#: the spellings of an IPv4 address that inet_aton accepts and ipaddress does not: 2130706433,
#: 0x7f000001, 0177.0.0.1, 127.1 (getaddrinfo accepts them too, so they must classify alike)
_LEGACY_V4 = re.compile(r"[0-9a-fA-FxX.]+")

_ARTICLE = {Blocked.UNSPECIFIED: "an"}


def _phrase(kind: Blocked) -> str:
    return f"{_ARTICLE.get(kind, 'a')} {kind.value} address"


def parse_address(value: str | int | IPAddress) -> IPAddress:
    """An IP address from a literal: dotted, IPv6 (brackets and a zone allowed), or the legacy
    IPv4 spellings (decimal ``2130706433``, hex, octal, ``127.1``). ValueError for anything else."""
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    if isinstance(value, int):
        return ipaddress.ip_address(value)
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _LEGACY_V4.fullmatch(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            pass
    raise ValueError(f"not an IP address: {value!r}")


def _literal(host: str) -> IPAddress | None:
    try:
        return parse_address(host)
    except ValueError:
        return None


def _standard_spelling(host: str) -> bool:
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for: IPv4-mapped, NAT64 well-known prefix, 6to4."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def classify_address(value: str | int | IPAddress) -> Blocked | None:
    """None for a public address; else why it is blocked by default. ``Blocked`` is a ``str``.

    IPv6 forms that carry an IPv4 address (``::ffff:a.b.c.d``, ``64:ff9b::a.b.c.d``, 6to4) are judged
    by the IPv4 address they carry, since that is where the packets go.
    """
    ip = parse_address(value)
    if ip in _CLOUD_METADATA:
        return Blocked.CLOUD_METADATA
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:  # fe80::1%eth0: compare the address, not the zone
            ip = ipaddress.IPv6Address(ip.packed)
            if ip in _CLOUD_METADATA:
                return Blocked.CLOUD_METADATA
        v4 = _embedded_v4(ip)
        if v4 is not None:
            return classify_address(v4)
        if ip in _NAT64_LOCAL:
            return Blocked.PRIVATE
    if ip.is_unspecified:
        return Blocked.UNSPECIFIED
    if ip.is_loopback:
        return Blocked.LOOPBACK
    if ip.is_link_local:
        return Blocked.LINK_LOCAL
    if ip.is_multicast:
        return Blocked.MULTICAST
    if isinstance(ip, ipaddress.IPv4Address):
        if any(ip in net for net in _PRIVATE_V4):
            return Blocked.PRIVATE
        if ip in _SHARED_V4:
            return Blocked.SHARED
    else:
        if ip in _ULA_V6:
            return Blocked.PRIVATE
        if ip.is_site_local:
            return Blocked.SITE_LOCAL
    if ip.is_reserved:
        return Blocked.RESERVED
    if ip.is_private or not ip.is_global:
        # documentation, benchmarking, protocol assignments, broadcast, Teredo, ...
        return Blocked.SPECIAL_PURPOSE
    return None


class OutboundRefused(Exception):
    """The outbound policy refused a connection or a response. The message is safe to show to the
    API client: it names the host and the reason, never headers, credentials, path or query."""

    def __init__(self, message: str, *, host: str, address: str | None = None, kind: Blocked | None = None) -> None:
        super().__init__(message)
        self.host = host
        #: the refused address (None when the refusal is not about an address)
        self.address = address
        self.kind = kind


class ResponseTooLarge(OutboundRefused):
    """A response body went (or declared it would go) past ``OutboundPolicy.max_response_bytes``."""

    def __init__(self, *, host: str, limit: int) -> None:
        super().__init__(f"The response from {host!r} is larger than the {limit}-byte limit.", host=host)
        self.limit = limit


def _refusal(host: str, ip: IPAddress, kind: Blocked) -> OutboundRefused:
    literal = _literal(host)
    if literal is not None and _standard_spelling(host):
        message = f"Refused to connect to {host!r}: it is {_phrase(kind)}."
    elif literal is not None:  # a legacy spelling of the address: 127.1, 2130706433
        message = f"Refused to connect to {host!r}: it is {ip}, {_phrase(kind)}."
    else:
        message = f"Refused to connect to {host!r}: it resolves to {ip}, {_phrase(kind)}."
    return OutboundRefused(message, host=host, address=str(ip), kind=kind)


async def system_resolver(host: str, port: int) -> list[str]:
    """The system resolver (``getaddrinfo``, through anyio so it runs off the event loop)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """Where outbound connections may go and what one response may cost.

    ``allow_networks``: CIDRs exempt from the block (an operator's in-cluster MCP server,
    ``"10.1.2.0/24"``; ``"127.0.0.0/8"`` in tests). A network with host bits set is a ValueError,
    so a typo does not silently exempt more or less than meant.
    ``max_response_bytes``: the most bytes of one response body (on the wire) read through a client.
    ``connect_timeout``: bounds name resolution plus connecting, per connection (a client's own
    connect timeout applies when shorter).
    ``resolver``: ``None`` for the system resolver; a hook for tests.
    """

    allow_networks: tuple[str, ...] = ()
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    connect_timeout: float = 10.0
    resolver: Resolver | None = field(default=None, compare=False)
    networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_response_bytes <= 0:
            raise ValueError("max_response_bytes must be positive")
        if self.connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        networks = []
        for net in self.allow_networks:
            try:
                networks.append(ipaddress.ip_network(net, strict=True))
            except ValueError as exc:
                raise ValueError(f"allow_networks: {net!r} is not a network ({exc})") from None
        object.__setattr__(self, "networks", tuple(networks))

    def exempt(self, ip: IPAddress) -> bool:
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address):
            plain = ipaddress.IPv6Address(ip.packed)  # without a zone
            candidates.append(plain)
            v4 = _embedded_v4(plain)
            if v4 is not None:
                candidates.append(v4)
        return any(c in net for c in candidates for net in self.networks if c.version == net.version)

    def refusal(self, value: str | int | IPAddress) -> Blocked | None:
        """Why this policy refuses the address, or None when it may be reached."""
        ip = parse_address(value)
        kind = classify_address(ip)
        if kind is None or self.exempt(ip):
            return None
        return kind


class _Guard:
    """Resolve, check, connect to the checked address: the work shared by both HTTP stacks.

    ``connect_error`` / ``connect_timeout`` are the stack's httpcore exception classes, so that the
    HTTP client maps them to its own ConnectError / ConnectTimeout as for any failed connect.
    """

    def __init__(
        self, policy: OutboundPolicy, connect_error: type[Exception], connect_timeout: type[Exception]
    ) -> None:
        self.policy = policy
        self._resolver: Resolver = policy.resolver or system_resolver
        self._connect_error = connect_error
        self._connect_timeout = connect_timeout

    async def checked_addresses(self, host: str, port: int) -> list[IPAddress]:
        """The addresses ``host`` resolves to, all of them allowed; OutboundRefused if any is not."""
        literal = _literal(host)
        if literal is not None:
            found = [literal]
        else:
            try:
                answers = await self._resolver(host, port)
            except OSError as exc:
                raise self._connect_error(f"Could not resolve {host!r} ({exc.strerror or exc}).") from None
            found = []
            for answer in answers:
                try:
                    ip = ipaddress.ip_address(answer)
                except ValueError:
                    raise self._connect_error(f"Could not resolve {host!r}.") from None
                if ip not in found:
                    found.append(ip)
            if not found:
                raise self._connect_error(f"Could not resolve {host!r}.")
        for ip in found:
            kind = self.policy.refusal(ip)
            if kind is not None:
                raise _refusal(host, ip, kind)
        return found

    def bound(self, timeout: float | None) -> float:
        limit = self.policy.connect_timeout
        return limit if timeout is None else min(timeout, limit)

    def timed_out(self, host: str) -> Exception:
        return self._connect_timeout(f"Connecting to {host!r} timed out.")

    def unix_socket(self) -> OutboundRefused:
        return OutboundRefused("Refused to connect to a Unix socket.", host="")


class _CoreBackend(httpcore.AsyncNetworkBackend):
    """httpcore's backend, guarded: connect_tcp resolves and checks, then connects to the IP."""

    def __init__(self, guard: _Guard, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._guard = guard
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        bound = self._guard.bound(timeout)
        try:
            with anyio.fail_after(bound):
                addresses = await self._guard.checked_addresses(host, port)
                failure: Exception | None = None
                for ip in addresses:
                    try:
                        return await self._inner.connect_tcp(
                            str(ip), port, timeout=bound, local_address=local_address, socket_options=socket_options
                        )
                    except httpcore.ConnectError as exc:
                        failure = exc
                assert failure is not None
                raise failure
        except TimeoutError:
            raise self._guard.timed_out(host) from None

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise self._guard.unix_socket()

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Core2Backend(httpcore2.AsyncNetworkBackend):
    """httpcore2's backend (the MCP SDK's stack), guarded as ``_CoreBackend``."""

    def __init__(self, guard: _Guard, inner: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self._guard = guard
        self._inner = inner or httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        bound = self._guard.bound(timeout)
        try:
            with anyio.fail_after(bound):
                addresses = await self._guard.checked_addresses(host, port)
                failure: Exception | None = None
                for ip in addresses:
                    try:
                        return await self._inner.connect_tcp(
                            str(ip), port, timeout=bound, local_address=local_address, socket_options=socket_options
                        )
                    except httpcore2.ConnectError as exc:
                        failure = exc
                assert failure is not None
                raise failure
        except TimeoutError:
            raise self._guard.timed_out(host) from None

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise self._guard.unix_socket()

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _check_head(method: bytes | str, host: str, headers: Mapping[str, str], limit: int) -> None:
    """Refuse a response by its head: a compressed body, or a declared length over the limit."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise OutboundRefused(
            f"The response from {host!r} is {encoding!r}-encoded; the gateway asks for identity encoding "
            "so that its response size limit holds.",
            host=host,
        )
    declared = headers.get("content-length", "")
    if method not in ("HEAD", b"HEAD") and declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(host=host, limit=limit)


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, *, host: str, limit: int) -> None:
        self._inner = inner
        self._host = host
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                await self._inner.aclose()  # the connection is not reusable mid-body: drop it now
                raise ResponseTooLarge(host=self._host, limit=self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream2(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, *, host: str, limit: int) -> None:
        self._inner = inner
        self._host = host
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                await self._inner.aclose()
                raise ResponseTooLarge(host=self._host, limit=self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with the guarded backend under its pool and a bound on each body.

    httpx 0.29 takes no ``network_backend``; its transport's only state is the httpcore pool, so this
    builds the same pool (HTTP/1.1, no proxy) with the guarded backend in it.
    """

    def __init__(self, guard: _Guard, ssl_context: ssl.SSLContext, limits: httpx.Limits) -> None:
        super().__init__(verify=ssl_context, trust_env=False, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CoreBackend(guard),
        )
        self._limit = guard.policy.max_response_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        host = request.url.host
        try:
            _check_head(request.method, host, response.headers, self._limit)
        except OutboundRefused:
            await response.aclose()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_BoundedStream(response.stream, host=host, limit=self._limit),
            extensions=response.extensions,
        )


class _GuardedTransport2(httpx2.AsyncHTTPTransport):
    """``_GuardedTransport`` for httpx2 (the MCP SDK's stack)."""

    def __init__(self, guard: _Guard, ssl_context: ssl.SSLContext, limits: httpx2.Limits) -> None:
        super().__init__(verify=ssl_context, trust_env=False, limits=limits)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Core2Backend(guard),
        )
        self._limit = guard.policy.max_response_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        host = request.url.host
        try:
            _check_head(request.method, host, response.headers, self._limit)
        except OutboundRefused:
            await response.aclose()
            raise
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_BoundedStream2(response.stream, host=host, limit=self._limit),
            extensions=response.extensions,
        )


#: set while a guarded client sends: httpx's own line per request is then logged without its URL
_GUARDED_SEND: ContextVar[bool] = ContextVar("respgate_guarded_send", default=False)
_WITHHELD = "[url withheld]"


class _WithholdGuardedUrls(logging.Filter):
    """httpx logs one line per request with its full URL (``HTTP Request: GET https://...``, INFO, so
    at ``log_level: debug``). A guarded client's URLs are the requester's data (a page the model
    opened, a search query in SearXNG's query string): in its lines every URL argument is replaced
    by ``[url withheld]``, the method and the status kept. Other clients' lines are left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _GUARDED_SEND.get() and isinstance(record.args, tuple):
            record.args = tuple(_WITHHELD if isinstance(a, httpx.URL) else a for a in record.args)
            if isinstance(record.msg, httpx.URL):
                record.msg = _WITHHELD
        return True


logging.getLogger("httpx").addFilter(_WithholdGuardedUrls())


class _GuardedClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` whose sends (``stream`` and the verbs all send) are marked for
    ``_WithholdGuardedUrls``."""

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = httpx.USE_CLIENT_DEFAULT,
        follow_redirects: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        token = _GUARDED_SEND.set(True)
        try:
            return await super().send(request, stream=stream, auth=auth, follow_redirects=follow_redirects)
        finally:
            _GUARDED_SEND.reset(token)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    merged = {"Accept-Encoding": "identity"}
    merged.update(headers or {})
    return merged


def guarded_client(
    policy: OutboundPolicy,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: httpx.Timeout | float | None = None,
    auth: httpx.Auth | tuple[str, str] | None = None,
    follow_redirects: bool = True,
    max_redirects: int = 5,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose every connection obeys ``policy`` (see the module docstring).

    ``timeout`` defaults to 30 s with ``policy.connect_timeout`` for connecting. ``ssl_context``: an
    operator's CA bundle (tests: a test CA); certificates are always verified, against the URL's host.
    Use it as ``async with guarded_client(...) as client:``. Refusals raise ``OutboundRefused`` from
    the request (or from reading the body, for ``ResponseTooLarge``).
    """
    guard = _Guard(policy, httpcore.ConnectError, httpcore.ConnectTimeout)
    limits = httpx.Limits()
    transport = _GuardedTransport(guard, ssl_context or httpx.create_ssl_context(), limits)
    return _GuardedClient(
        transport=transport,
        trust_env=False,
        headers=_headers(headers),
        timeout=httpx.Timeout(30.0, connect=policy.connect_timeout) if timeout is None else timeout,
        auth=auth,
        follow_redirects=follow_redirects,
        max_redirects=max_redirects,
    )


class McpClientFactory(Protocol):
    """The shape of the ``mcp`` SDK's ``McpHttpClientFactory`` (mcp.shared._httpx_utils, SDK 2.3)."""

    def __call__(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient: ...


def mcp_client_factory(
    policy: OutboundPolicy, *, max_redirects: int = 5, ssl_context: ssl.SSLContext | None = None
) -> McpClientFactory:
    """A factory of guarded ``httpx2.AsyncClient`` s for the ``mcp`` SDK (2.x uses httpx2).

    How to use it with the SDK's two HTTP transports::

        factory = mcp_client_factory(policy)
        # Streamable HTTP takes a client, which the caller enters and closes:
        async with factory(headers=auth_headers) as http:
            async with Client(streamable_http_client(url, http_client=http)) as mcp: ...
        # SSE (older servers) takes the factory itself:
        async with Client(sse_client(url, headers=auth_headers, httpx_client_factory=factory)) as mcp: ...

    How a refusal reaches the caller: the SDK sends each request from a task in the transport's
    task group, and the caller's ``async with`` body runs inside that group. When the POST task
    raises ``OutboundRefused`` (the SDK catches only ``httpx2`` errors there, and this is not one),
    the group cancels the caller's pending call and the ``async with`` raises an ``ExceptionGroup``
    that holds the ``OutboundRefused`` (possibly nested in further groups). Find it with
    ``find_refusal(exc)``, or ``except* OutboundRefused``. ``ResponseTooLarge`` surfaces the same
    way; the size bound is per response, so a long-lived event stream also ends (with that error)
    after ``max_response_bytes`` in all. Redirects: the SDK follows only within the endpoint's
    origin (``follow_redirects`` is off here, as in the SDK's own client); every connection is
    checked regardless.
    """
    guard = _Guard(policy, httpcore2.ConnectError, httpcore2.ConnectTimeout)
    context = ssl_context or httpx2.create_ssl_context()

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        limits = httpx2.Limits()
        if timeout is None:
            timeout = httpx2.Timeout(_MCP_TIMEOUT_S, connect=policy.connect_timeout, read=_MCP_SSE_READ_TIMEOUT_S)
        return httpx2.AsyncClient(
            transport=_GuardedTransport2(guard, context, limits),
            trust_env=False,
            headers=_headers(headers),
            timeout=timeout,
            auth=auth,
            follow_redirects=False,
            max_redirects=max_redirects,
        )

    return factory


def find_refusal(exc: BaseException) -> OutboundRefused | None:
    """The ``OutboundRefused`` inside ``exc``: itself, in an (nested) exception group, or as its
    cause/context (an SDK that wrapped it). None when there is none."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OutboundRefused):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return None
