"""security/outbound.py: no outbound connection reaches a blocked address (no SSRF).

Real sockets on loopback only: small asyncio HTTP servers started here count the connections they
accept, so "refused" means the server saw nothing, not merely that an error was raised. Names are
resolved by a test resolver (the policy's hook) except ``localhost``; nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import traceback
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import httpx2
import pytest

from security.outbound import (
    Blocked,
    OutboundPolicy,
    OutboundRefused,
    ResponseTooLarge,
    classify_address,
    find_refusal,
    guarded_client,
    mcp_client_factory,
)

SECRET = "sk-live-4f1e9c0d-credential"

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]


@dataclass
class Server:
    """An HTTP/1.1 server on a loopback address that records each connection and request head."""

    host: str
    port: int
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


async def _reply_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


@asynccontextmanager
async def serve(
    host: str = "127.0.0.1", port: int = 0, reply: Reply = _reply_ok, tls: ssl.SSLContext | None = None
) -> AsyncIterator[Server]:
    server = Server(host, port)
    if tls is not None:
        tls.sni_callback = lambda sock, name, ctx: server.sni.append(name)

    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            server.heads.append(head)
            await reply(reader, writer, head)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            pass  # torn down below; ending normally spares 3.11's streams callback a cancelled task
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, host, port, ssl=tls)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        for task in handlers:  # a reply still writing to a client that hung up
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await listener.wait_closed()


def resolver_answering(*answers: Sequence[str]) -> tuple[Callable[[str, int], Awaitable[Sequence[str]]], list[str]]:
    """A resolver that gives its answers in turn (the last one repeats), and the names it was asked."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> Sequence[str]:
        asked.append(host)
        return answers[min(len(asked), len(answers)) - 1]

    return resolve, asked


# --- classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", Blocked.LOOPBACK),
        ("127.255.0.9", Blocked.LOOPBACK),
        ("::1", Blocked.LOOPBACK),
        ("::ffff:127.0.0.1", Blocked.LOOPBACK),  # IPv4-mapped
        ("[::ffff:7f00:1]", Blocked.LOOPBACK),
        ("64:ff9b::7f00:1", Blocked.LOOPBACK),  # NAT64 of 127.0.0.1
        ("2002:7f00:1::", Blocked.LOOPBACK),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", Blocked.PRIVATE),  # 6to4 of 10.0.0.1
        ("2130706433", Blocked.LOOPBACK),  # decimal
        ("0x7f000001", Blocked.LOOPBACK),  # hex
        ("0177.0.0.1", Blocked.LOOPBACK),  # octal
        ("127.1", Blocked.LOOPBACK),  # short form
        (2130706433, Blocked.LOOPBACK),
        ("0.0.0.0", Blocked.UNSPECIFIED),
        ("0", Blocked.UNSPECIFIED),
        ("::", Blocked.UNSPECIFIED),
        ("169.254.169.254", Blocked.CLOUD_METADATA),
        ("::ffff:169.254.169.254", Blocked.CLOUD_METADATA),
        ("fd00:ec2::254", Blocked.CLOUD_METADATA),
        ("fd00:ec2::254%eth0", Blocked.CLOUD_METADATA),  # with a zone
        ("168.63.129.16", Blocked.CLOUD_METADATA),  # a public address, blocked by name
        ("100.100.100.200", Blocked.CLOUD_METADATA),
        ("169.254.1.1", Blocked.LINK_LOCAL),
        ("fe80::1", Blocked.LINK_LOCAL),
        ("fe80::1%lo", Blocked.LINK_LOCAL),
        ("10.1.2.3", Blocked.PRIVATE),
        ("172.16.0.1", Blocked.PRIVATE),
        ("192.168.1.1", Blocked.PRIVATE),
        ("fd00::1", Blocked.PRIVATE),
        ("fc00::1", Blocked.PRIVATE),
        ("64:ff9b:1::a00:1", Blocked.PRIVATE),  # local-use NAT64
        ("100.64.0.1", Blocked.SHARED),
        ("224.0.0.1", Blocked.MULTICAST),
        ("ff02::1", Blocked.MULTICAST),
        ("fec0::1", Blocked.SITE_LOCAL),
        ("240.0.0.1", Blocked.RESERVED),
        ("255.255.255.255", Blocked.RESERVED),
        ("::127.0.0.1", Blocked.RESERVED),  # IPv4-compatible (deprecated)
        ("192.0.2.1", Blocked.SPECIAL_PURPOSE),  # documentation
        ("198.18.0.1", Blocked.SPECIAL_PURPOSE),  # benchmarking
        ("2001:db8::1", Blocked.SPECIAL_PURPOSE),
        ("2001::1", Blocked.SPECIAL_PURPOSE),  # Teredo
    ],
)
def test_blocked_addresses_classify_with_their_reason(address: str | int, kind: Blocked) -> None:
    assert classify_address(address) == kind
    assert OutboundPolicy().refusal(address) == kind


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]
)
def test_public_addresses_classify_as_none(address: str) -> None:
    assert classify_address(address) is None


def test_allow_networks_exempt_exactly_their_networks() -> None:
    policy = OutboundPolicy(allow_networks=("10.1.2.0/24", "127.0.0.1/32"))
    assert policy.refusal("10.1.2.200") is None
    assert policy.refusal("10.1.3.1") == Blocked.PRIVATE
    assert policy.refusal("::ffff:127.0.0.1") is None  # the mapped form of an exempt address
    assert policy.refusal("127.0.0.2") == Blocked.LOOPBACK


@pytest.mark.parametrize("network", ["10.1.2.3/24", "not-a-network", "10.0.0.0/33"])
def test_a_bad_allow_network_is_a_value_error(network: str) -> None:
    with pytest.raises(ValueError, match="allow_networks"):
        OutboundPolicy(allow_networks=(network,))


def test_classify_rejects_what_is_not_an_address() -> None:
    with pytest.raises(ValueError, match="not an IP address"):
        classify_address("example.com")


# --- connections --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("127.0.0.1", "Refused to connect to '127.0.0.1': it is a loopback address."),
        ("localhost", "Refused to connect to 'localhost': it resolves to 127.0.0.1, a loopback address."),
        ("127.1", "Refused to connect to '127.1': it is 127.0.0.1, a loopback address."),
        ("2130706433", "Refused to connect to '2130706433': it is 127.0.0.1, a loopback address."),
        ("[::ffff:127.0.0.1]", "Refused to connect to '::ffff:127.0.0.1': it is a loopback address."),
    ],
)
async def test_loopback_is_refused_by_default_and_the_server_sees_no_connection(host: str, message: str) -> None:
    # the test resolver answers for localhost (the system's may list ::1 first); literals never reach it
    policy = OutboundPolicy(resolver=resolver_answering(["127.0.0.1"])[0])
    async with serve() as server, guarded_client(policy) as client:
        with pytest.raises(OutboundRefused) as refused:
            await client.get(f"http://{host}:{server.port}/")
    assert str(refused.value) == message
    assert refused.value.kind == Blocked.LOOPBACK
    assert server.connections == 0


async def test_the_system_resolver_answer_for_localhost_is_refused() -> None:
    async with serve() as server, guarded_client(OutboundPolicy()) as client:
        with pytest.raises(OutboundRefused, match="'localhost': it resolves to .*a loopback address"):
            await client.get(f"http://localhost:{server.port}/")
    assert server.connections == 0


async def test_an_exempt_network_is_reachable() -> None:
    async with serve() as server, guarded_client(OutboundPolicy(allow_networks=("127.0.0.1/32",))) as client:
        response = await client.get(server.url)
    assert (response.status_code, response.text) == (200, "ok")
    assert server.connections == 1
    # the client asks for an uncompressed body, so that the size bound counts what it will hold
    assert b"accept-encoding: identity" in server.heads[0].lower()


def _redirect_to(location: str) -> Reply:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        head = f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        writer.write(head.encode())

    return reply


@pytest.mark.parametrize(("allowed", "second_reached"), [(("127.0.0.1/32",), False), (("127.0.0.0/8",), True)])
async def test_each_redirect_hop_is_checked(allowed: tuple[str, ...], second_reached: bool) -> None:
    async with serve("127.0.0.2") as second, serve(reply=_redirect_to(second.url)) as first:
        async with guarded_client(OutboundPolicy(allow_networks=allowed)) as client:
            if second_reached:  # the control: the same redirect, with the hop's address exempt
                assert (await client.get(first.url)).text == "ok"
            else:
                with pytest.raises(OutboundRefused, match="'127.0.0.2': it is a loopback address") as refused:
                    await client.get(first.url)
                assert refused.value.address == "127.0.0.2"
    assert first.connections == 1
    assert second.connections == (1 if second_reached else 0)


async def test_the_connection_goes_to_the_checked_address_not_a_second_lookup() -> None:
    """DNS rebinding: the name answers an exempt address first and a blocked one after. The first
    connection lands on the checked address (the name itself is not resolvable, so a connect by
    name would have failed), the resolver was asked once per connection, and the later answer is
    refused before any connection to it."""
    resolve, asked = resolver_answering(["127.0.0.1"], ["127.0.0.2"])
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), resolver=resolve)
    async with serve("127.0.0.1") as exempt, serve("127.0.0.2", exempt.port) as blocked:
        url = f"http://rebind.invalid:{exempt.port}/"
        async with guarded_client(policy) as client:
            assert (await client.get(url)).text == "ok"
            assert asked == ["rebind.invalid"]
            with pytest.raises(OutboundRefused, match="resolves to 127.0.0.2, a loopback address"):
                await client.get(url)  # the server closed the first connection: a new one, a new lookup
    assert asked == ["rebind.invalid", "rebind.invalid"]
    assert (exempt.connections, blocked.connections) == (1, 0)
    assert exempt.heads[0].lower().count(b"host: rebind.invalid:") == 1  # the URL's host, not the IP


@pytest.mark.parametrize("answer", [["127.0.0.1", "127.0.0.2"], ["127.0.0.2", "127.0.0.1"], ["127.0.0.1", "10.9.9.9"]])
async def test_a_name_with_any_blocked_address_is_refused(answer: list[str]) -> None:
    resolve, _ = resolver_answering(answer)
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), resolver=resolve)
    async with serve() as server, guarded_client(policy) as client:
        with pytest.raises(OutboundRefused) as refused:
            await client.get(f"http://mixed.invalid:{server.port}/")
    assert refused.value.address == next(a for a in answer if a != "127.0.0.1")
    assert server.connections == 0


async def test_a_resolver_that_never_answers_costs_the_connect_timeout() -> None:
    async def never(host: str, port: int) -> Sequence[str]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with guarded_client(OutboundPolicy(connect_timeout=0.2, resolver=never)) as client:
        with pytest.raises(httpx.ConnectTimeout, match="'slow.invalid'"):
            await client.get("http://slow.invalid/")


async def test_a_name_that_does_not_resolve_is_a_connect_error() -> None:
    async def nothing(host: str, port: int) -> Sequence[str]:
        return []

    async with guarded_client(OutboundPolicy(resolver=nothing)) as client:
        with pytest.raises(httpx.ConnectError, match="Could not resolve 'nowhere.invalid'"):
            await client.get("http://nowhere.invalid/")


# --- responses ------------------------------------------------------------------------------------------

OFFERED = 200 * 1024 * 1024
CAP = 1024 * 1024


def _endless(sent: list[int]) -> Reply:
    """A body of OFFERED bytes, delimited by the connection's close (no length declared)."""

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        chunk = b"x" * 65536
        while sent[0] < OFFERED:
            writer.write(chunk)
            await writer.drain()
            sent[0] += len(chunk)

    return reply


def _clients(policy: OutboundPolicy) -> dict[str, Callable[[], httpx.AsyncClient | httpx2.AsyncClient]]:
    return {"httpx": lambda: guarded_client(policy), "httpx2 (mcp)": lambda: mcp_client_factory(policy)()}


@pytest.mark.parametrize("stack", ["httpx", "httpx2 (mcp)"])
async def test_a_huge_body_is_cut_at_the_limit_with_bounded_memory(stack: str) -> None:
    sent = [0]
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), max_response_bytes=CAP)
    async with serve(reply=_endless(sent)) as server, _clients(policy)[stack]() as client:
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge) as too_large:
                await client.get(server.url)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert str(too_large.value) == f"The response from '127.0.0.1' is larger than the {CAP}-byte limit."
    assert peak < 4 * CAP, peak
    assert sent[0] < OFFERED // 4  # the client hung up: the server could not send it all


def _declaring(length: int, extra: bytes = b"") -> Reply:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (length, extra) + b"x" * min(length, 4096))

    return reply


async def test_a_declared_length_over_the_limit_is_refused_from_the_head() -> None:
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), max_response_bytes=1000)
    async with serve(reply=_declaring(OFFERED)) as server, guarded_client(policy) as client:
        with pytest.raises(ResponseTooLarge):
            async with client.stream("GET", server.url):
                raise AssertionError("the head alone is refused")
    async with serve(reply=_declaring(1000)) as server, guarded_client(policy) as client:
        assert len((await client.get(server.url)).content) == 1000  # at the limit: fine


async def test_a_compressed_body_is_refused() -> None:
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",))
    async with serve(reply=_declaring(100, b"Content-Encoding: gzip\r\n")) as server, guarded_client(policy) as client:
        with pytest.raises(OutboundRefused, match="'gzip'-encoded; the gateway asks for identity"):
            await client.get(server.url)


async def test_no_error_text_carries_the_credentials() -> None:
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), max_response_bytes=CAP)
    seen: list[BaseException] = []
    async with serve(reply=_endless([0])) as huge, serve("127.0.0.2") as blocked:
        for url in (blocked.url, f"http://user:{SECRET}@127.0.0.2:{blocked.port}/?key={SECRET}", huge.url):
            async with guarded_client(policy, headers={"Authorization": f"Bearer {SECRET}"}) as client:
                with pytest.raises(OutboundRefused) as refused:
                    await client.get(url)
                seen.append(refused.value)
        factory = mcp_client_factory(policy)
        async with factory(headers={"Authorization": f"Bearer {SECRET}"}, auth=httpx2.BasicAuth("u", SECRET)) as c2:
            with pytest.raises(OutboundRefused) as refused:
                await c2.get(blocked.url)
            seen.append(refused.value)
    assert [type(e) for e in seen] == [OutboundRefused, OutboundRefused, ResponseTooLarge, OutboundRefused]
    for exc in seen:
        text = "".join(traceback.format_exception(exc)) + repr(exc) + repr(vars(exc))
        assert SECRET not in text
        assert "127.0.0." in str(exc)


# --- TLS --------------------------------------------------------------------------------------------------


def _test_ca(tmp: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context with a certificate for ``name``, client context trusting its CA)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("respgate test CA", ca_key, "respgate test CA", ca_key, True)
    leaf = cert(name, leaf_key, "respgate test CA", ca_key, False)
    (tmp / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (tmp / "leaf.key").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp / "leaf.pem", tmp / "leaf.key")
    return server_ctx, ssl.create_default_context(cafile=tmp / "ca.pem")


async def test_tls_verifies_and_sends_sni_for_the_url_host(tmp_path: Path) -> None:
    server_ctx, client_ctx = _test_ca(tmp_path, "mcp.test")
    resolve, _ = resolver_answering(["127.0.0.1"])
    policy = OutboundPolicy(allow_networks=("127.0.0.1/32",), resolver=resolve)
    async with serve(tls=server_ctx) as server:
        async with guarded_client(policy, ssl_context=client_ctx) as client:
            response = await client.get(f"https://mcp.test:{server.port}/")
            assert response.text == "ok"
            # the same server by its IP: the certificate names mcp.test, so verification must fail
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|IP address mismatch"):
                await client.get(f"https://127.0.0.1:{server.port}/")
        async with mcp_client_factory(policy, ssl_context=client_ctx)() as client2:
            assert (await client2.get(f"https://mcp.test:{server.port}/")).text == "ok"
    assert server.sni[0] == "mcp.test"
    assert server.sni[-1] == "mcp.test"


# --- the mcp SDK ----------------------------------------------------------------------------------------


async def test_the_mcp_sdk_surfaces_a_refusal_to_its_caller() -> None:
    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    factory = mcp_client_factory(OutboundPolicy())
    async with serve() as server:
        url = f"http://127.0.0.1:{server.port}/mcp"
        with pytest.raises(BaseExceptionGroup) as streamable:  # a task of the transport's task group raised
            async with asyncio.timeout(30), factory(headers={"Authorization": f"Bearer {SECRET}"}) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    await client.list_tools()
        with pytest.raises(OutboundRefused) as sse:  # SSE connects before its task group starts
            async with asyncio.timeout(30), Client(sse_client(url, httpx_client_factory=factory)) as client:
                await client.list_tools()
    refusal = find_refusal(streamable.value)
    assert refusal is not None and refusal.kind == Blocked.LOOPBACK
    assert streamable.value.subgroup(OutboundRefused) is not None
    assert find_refusal(sse.value) is sse.value
    assert server.connections == 0


async def test_the_mcp_sdk_reaches_an_exempt_server_through_the_factory() -> None:
    uvicorn = pytest.importorskip("uvicorn")
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server import MCPServer

    mcp = MCPServer("outbound-test")

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    config = uvicorn.Config(mcp.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            factory = mcp_client_factory(OutboundPolicy(allow_networks=("127.0.0.1/32",)))
            async with factory() as http:
                async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client:
                    tools = await client.list_tools()
                    result = await client.call_tool("add", {"a": 2, "b": 3})
    finally:
        server.should_exit = True
        await task
    assert [t.name for t in tools.tools] == ["add"]
    assert "5" in str(result.content)


def test_ipv4_mapped_exemption_matches_the_carried_address() -> None:
    policy = OutboundPolicy(allow_networks=("10.1.2.0/24",))
    mapped = ipaddress.IPv6Address("::ffff:10.1.2.3")
    assert policy.exempt(mapped)
    assert not policy.exempt(ipaddress.IPv6Address("::ffff:10.1.3.3"))
