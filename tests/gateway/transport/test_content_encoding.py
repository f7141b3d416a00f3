"""Compressed request bodies and gzip'd JSON answers (issue 31 part 3), against a live server.

Before: a body sent with ``Content-Encoding: gzip`` (or ``zstd``, which Codex and proxies in front
of it can send, or ``br``) was parsed as the JSON it is not, 400 ``invalid_json``. Now each coding
is decoded as the body arrives (gateway/transport/body_encoding.py), the size limit on the decoded
bytes, so a bomb is a 413 that costs the server the limit, not what the bomb inflates to; a coding
the gateway does not decode is a 415 naming it; data that does not decode is a 400
``invalid_content_encoding``. Answers: JSON is gzip'd when the client accepts it, SSE never.

The bombs run against a gateway in its own process (tests/chaos.py), whose peak RSS is read from
the kernel's high-water mark; each is 10 GiB of zeros compressed lazily as it is sent, so the test
compresses only what the server reads before it refuses, plus what the sockets buffer.
"""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import brotli
import httpx
import pytest

from gateway.base.settings import Settings
from gateway.transport.body_encoding import MAX_LAYERS, MAX_MEMBERS, STEP, BodyDecoder, DecodedTooLarge
from gateway.wire.validation import InputRejected
from tests.chaos import ChaosGateway, MiB, chaos_gateway
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, assert_still_serving, parse_sse, post

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

CODINGS = ["gzip", "deflate", "zstd", "br"]
GiB = 1024 * MiB
LIMIT = 32 * MiB  # max_request_bytes, the default
GZ = {"content-encoding": "gzip"}


def encode(coding: str, data: bytes) -> bytes:
    """``data`` in one coding, as a client library writes it."""
    if coding in ("gzip", "x-gzip"):
        return gzip.compress(data)
    if coding == "deflate":
        return zlib.compress(data)  # RFC 9110's deflate: the zlib format
    if coding == "raw-deflate":
        z = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return z.compress(data) + z.flush()
    if coding == "zstd":
        return zstd.compress(data)
    if coding == "br":
        return bytes(brotli.compress(data))
    raise ValueError(coding)


def encode_all(header: str, data: bytes) -> bytes:
    """``data`` in every coding a ``Content-Encoding`` value lists, in the order listed (applied)."""
    for coding in (c.strip() for c in header.split(",")):
        if coding != "identity":
            data = encode(coding, data)
    return data


def zeros_encoded(coding: str, total: int = 10 * GiB, piece: int = MiB) -> Iterator[bytes]:
    """``total`` zero bytes in ``coding``, compressed a piece at a time as the sender asks for them,
    with the largest window each coding allows a client (the decoder's worst case)."""
    zero = bytes(piece)
    step: Callable[[], bytes]
    end: Callable[[], bytes]
    if coding in ("gzip", "deflate"):
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
        step, end = (lambda: z.compress(zero)), z.flush
    elif coding == "zstd":
        P = zstd.CompressionParameter
        c = zstd.ZstdCompressor(options={P.window_log: 23, P.compression_level: 3})
        step, end = (lambda: c.compress(zero)), (lambda: c.flush())
    else:
        b = brotli.Compressor(quality=5, lgwin=24)
        step, end = (lambda: b.process(zero)), b.finish
    for _ in range(total // piece):
        if out := step():
            yield out
    yield end()


class Compressing(httpx.HTTPTransport):
    """An httpx transport that sends every request body in ``codings`` (what a compressing proxy in
    front of the client does), so the real openai SDK can send compressed creates."""

    def __init__(self, codings: str) -> None:
        super().__init__()
        self.codings = codings
        self.sent: list[tuple[int, int]] = []  # (plain, encoded) body sizes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        plain = request.read()
        if plain:
            body = encode_all(self.codings, plain)
            headers = httpx.Headers(request.headers)
            headers["content-encoding"] = self.codings
            headers["content-length"] = str(len(body))
            request = httpx.Request(request.method, request.url, headers=headers, content=body)
            self.sent.append((len(plain), len(body)))
        return super().handle_request(request)


def rejections(live: LiveGateway, reason: str) -> float:
    return live.metric("respgate_input_rejections_total", {"transport": "http", "reason": reason})


# -- each coding decoded --------------------------------------------------------------------------------


@pytest.mark.parametrize("codings", ["gzip", "x-gzip", "deflate", "zstd", "br", "gzip, br", "zstd, deflate"])
def test_the_sdk_creates_with_a_compressed_body(gateway: LiveGateway, codings: str):
    """The openai SDK's create, its body compressed on the way: the same response as uncompressed
    (its metadata echoed, the same input tokens counted), the stacked codings decoded in reverse."""
    text = "Compressed bodies are decoded before they are parsed. " * 400
    plain = gateway.openai().responses.create(model=MODEL, input=text, metadata={"sent": "plain"})
    transport = Compressing(codings)
    with httpx.Client(transport=transport) as http:
        client = gateway.openai(http_client=http)
        r = client.responses.create(model=MODEL, input=text, metadata={"sent": codings})
        tokens = client.responses.input_tokens.count(model=MODEL, input=text)
    assert r.status == "completed" and r.metadata == {"sent": codings}
    assert r.usage is not None and plain.usage is not None
    assert r.usage.input_tokens == plain.usage.input_tokens == tokens.input_tokens
    assert all(encoded < plain_size / 10 for plain_size, encoded in transport.sent), transport.sent


def test_a_raw_deflate_body_is_decoded_too(gateway: LiveGateway):
    """Some clients send ``deflate`` without its zlib wrapper; its first two bytes tell it apart."""
    body = b'{"model": "%s", "input": "hi", "metadata": {"k": "raw"}}' % MODEL.encode()
    r = post(gateway, encode("raw-deflate", body), headers={"content-encoding": "deflate"})
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "raw"}, r.text


def test_codings_listed_on_several_header_lines_and_identity(gateway: LiveGateway):
    """A list may span header lines (RFC 9110 §5.3), in order; ``identity`` is no coding."""
    body = b'{"model": "%s", "input": "hi"}' % MODEL.encode()
    headers = httpx.Headers(
        [("content-type", "application/json"), ("content-encoding", "gzip"), ("content-encoding", "identity, br")]
    )
    r = httpx.post(gateway.base_url + "/responses", content=encode_all("gzip, br", body), headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    r = post(gateway, body, headers={"content-encoding": "identity"})
    assert r.status_code == 200, r.text


def test_every_json_route_decodes(gateway: LiveGateway):
    """Conversations and compaction read their bodies through the same reader."""
    r = post(gateway, gzip.compress(b'{"metadata": {"k": "v"}}'), path="/conversations", headers=GZ)
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "v"}, r.text
    body = b'{"model": "%s", "input": [{"role": "user", "content": "hi"}]}' % MODEL.encode()
    r = post(gateway, encode("zstd", body), path="/responses/compact", headers={"content-encoding": "zstd"})
    assert r.status_code == 200 and r.json()["object"] == "response.compaction", r.text


def test_a_decoded_body_that_is_not_json_is_invalid_json(gateway: LiveGateway):
    """Decoding is transparent: what it yields is checked as any body is."""
    r = post(gateway, gzip.compress(b"{not json"), headers=GZ)
    assert_error(r, 400, code="invalid_json")


# -- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["compress", "x-compress", "snappy", "gzip;q=1"])
def test_a_coding_it_does_not_decode_is_415_naming_it(gateway: LiveGateway, coding: str):
    r = post(gateway, b'{"model": "m"}', headers={"content-encoding": coding})
    err = assert_error(r, 415, code="unsupported_content_encoding", param=None)
    assert f"'{coding}'" in err["message"], err
    assert r.headers["accept-encoding"] == "gzip, deflate, zstd, br"  # RFC 9110 §15.5.16: what it would take
    assert rejections(gateway, "unsupported_encoding") == 1
    assert_still_serving(gateway)


def test_more_stacked_codings_than_the_cap_are_415(gateway: LiveGateway):
    codings = ", ".join(["gzip"] * (MAX_LAYERS + 1))
    body = b'{"model": "%s", "input": "hi"}' % MODEL.encode()
    r = post(gateway, encode_all(codings, body), headers={"content-encoding": codings})
    err = assert_error(r, 415, code="unsupported_content_encoding")
    assert f"at most {MAX_LAYERS}" in err["message"], err
    at_cap = ", ".join(["gzip"] * MAX_LAYERS)
    assert post(gateway, encode_all(at_cap, body), headers={"content-encoding": at_cap}).status_code == 200


def _corrupt(coding: str) -> dict[str, bytes]:
    good = encode(coding, b'{"model": "%s", "input": "%s"}' % (MODEL.encode(), b"y" * 5000))
    return {
        "garbage": b"this is not compressed at all, not even a little",
        "truncated": good[: len(good) // 2],
        "flipped": good[:6] + bytes(b ^ 0xFF for b in good[6:40]) + good[40:],
        "trailing": good + b"\x01junk after the end",
        "empty": b"",
    }


@pytest.mark.parametrize("coding", CODINGS)
def test_data_that_does_not_decode_is_400_naming_the_coding(gateway: LiveGateway, coding: str):
    cases = _corrupt(coding)
    for case, data in cases.items():
        r = post(gateway, data, headers={"content-encoding": coding})
        err = assert_error(r, 400, code="invalid_content_encoding")
        assert f"not valid {coding} data" in err["message"], (case, err)
    assert rejections(gateway, "invalid_encoding") == len(cases)
    assert_still_serving(gateway)


def test_a_zstd_window_past_rfc_9659s_8_mib_is_refused(gateway: LiveGateway):
    """A frame may ask its decoder for a window of up to 8 MiB (RFC 9659); zstd's own default would
    allocate up to 128 MiB for a frame of a few bytes."""
    P = zstd.CompressionParameter
    c = zstd.ZstdCompressor(options={P.window_log: 24})
    frame = c.compress(b'{"model": "m", "input": "hi"}') + c.flush()  # streamed: the header states the window
    err = assert_error(post(gateway, frame, headers={"content-encoding": "zstd"}), 400, code="invalid_content_encoding")
    assert "memory" in err["message"], err
    c = zstd.ZstdCompressor(options={P.window_log: 23})
    ok = c.compress(b'{"model": "%s", "input": "hi"}' % MODEL.encode()) + c.flush()
    assert post(gateway, ok, headers={"content-encoding": "zstd"}).status_code == 200


def test_more_concatenated_members_than_the_cap_are_refused(gateway: LiveGateway):
    """An empty gzip member is 20 bytes that each cost a fresh decompressor."""
    body = b'{"model": "%s", "input": "hi"}' % MODEL.encode()
    members = gzip.compress(body[:10]) + gzip.compress(body[10:])
    assert post(gateway, members, headers=GZ).status_code == 200  # members make one body (gzip -d)
    err = assert_error(
        post(gateway, gzip.compress(b"") * MAX_MEMBERS + gzip.compress(body), headers=GZ),
        400,
        code="invalid_content_encoding",
    )
    assert f"more than {MAX_MEMBERS}" in err["message"], err


def test_the_limit_is_on_the_decoded_bytes(make_gateway: Callable[..., LiveGateway]):
    """A body well under the limit on the wire whose decoded size is over it: the same 413 as a body
    that is over it as sent, counted the same."""
    live = make_gateway(Settings(max_request_bytes=64 * 1024))
    big = b'{"model": "%s", "input": "%s"}' % (MODEL.encode(), b"z" * (256 * 1024))
    for coding in CODINGS:
        data = encode(coding, big)
        assert len(data) < 64 * 1024
        r = post(live, data, headers={"content-encoding": coding})
        assert_error(r, 413, code="request_too_large")
    assert rejections(live, "size") == len(CODINGS)
    small = encode("br", b'{"model": "%s", "input": "hi"}' % MODEL.encode())
    assert post(live, small, headers={"content-encoding": "br"}).status_code == 200


# -- bombs: 10 GiB of zeros, refused at the limit with bounded memory ---------------------------------------


@pytest.fixture(scope="module")
def bomb_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosGateway]:
    with chaos_gateway(tmp_path_factory.mktemp("bombs"), max_request_bytes=LIMIT, rate_limit_rpm=100_000) as gw:
        yield gw


#: the most a decoder of each coding may hold besides its output: its window (zstd's as RFC 9659
#: bounds it, brotli's by its format)
WINDOW = {"gzip": 32 * 1024, "deflate": 32 * 1024, "zstd": 8 * MiB, "br": 16 * MiB}
#: what else the server may add to its resident set while refusing a bomb, beyond the decoded limit
#: it holds and the window: the step in flight (brotli's may be two) and allocator slack
SLACK = 2 * STEP + 8 * MiB


@pytest.mark.slow
@pytest.mark.parametrize("coding", CODINGS)
def test_a_compression_bomb_is_413_at_the_limit_with_bounded_memory(bomb_gateway: ChaosGateway, coding: str):
    """GiBs of zeros in each coding (2 GiB: ~2 MB of gzip or deflate; 10 GiB: 320 KB of zstd, 8 KB of br),
    sent as it is compressed: the server reads the body (its bytes on the wire bounded by the
    limit too), then stops decoding just past the limit and answers 413; its resident set grows
    by about what was sent, the limit and the coding's window, never by what the bomb inflates to.
    (The body is decoded once whole, so that one which stalls holds only what it sent.)"""
    gw = bomb_gateway
    sent = [0]

    def body() -> Iterator[bytes]:
        # the server reads the whole body before it decodes: the client compresses all of it, and
        # 10 GiB of zeros at gzip's level 9 is 30 s of the sender's CPU — 2 GiB (64x the limit)
        # makes the same point for gzip and deflate; zstd and br compress 10 GiB in seconds
        total = 2 * GiB if coding in ("gzip", "deflate") else 10 * GiB
        for piece in zeros_encoded(coding, total):
            sent[0] += len(piece)
            yield piece

    with gw.rss_peak() as peak:
        r = httpx.post(
            gw.url + "/v1/responses",
            content=body(),
            headers={"content-encoding": coding, "content-type": "application/json"},
            timeout=120,
        )
    print(f"{coding}: {peak}, growth {peak.growth / MiB:.1f} MiB; client sent {sent[0] / 1024:.0f} KiB compressed")
    assert_error(r, 413, code="request_too_large")
    assert peak.growth < LIMIT + sent[0] + WINDOW[coding] + SLACK, (coding, str(peak))
    assert gw.alive()
    ok = httpx.post(
        gw.url + "/v1/responses",
        content=encode(coding, b'{"model": "%s", "input": "still there?"}' % MODEL.encode()),
        headers={"content-encoding": coding, "content-type": "application/json"},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text


# -- the decoder, in process --------------------------------------------------------------------------


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("chunk", [1, 7, 64 * 1024])
def test_the_decoder_decodes_whatever_the_chunking(coding: str, chunk: int):
    """The body may arrive in pieces of any size, a header split anywhere; decoded exactly."""
    plain = bytes(range(256)) * 40 + b"x" * (3 * STEP)
    data = encode(coding, plain)
    if chunk == 1:
        data, plain = encode(coding, plain[:5000]), plain[:5000]  # byte by byte: a short one
    d = BodyDecoder.for_headers([coding], 4 * STEP)
    for i in range(0, len(data), chunk):
        for _ in d.feed(data[i : i + chunk]):
            pass
    assert d.body() == plain


def test_the_decoder_stops_a_bomb_a_step_past_the_limit():
    """Decoded output is kept until it passes the limit, then dropped; no call inflates more than a
    step (brotli's may overshoot by a buffer block)."""
    for coding in CODINGS:
        d = BodyDecoder.for_headers([coding], 4 * MiB)
        with pytest.raises(DecodedTooLarge):
            for piece in zeros_encoded(coding, total=GiB):
                for _ in d.feed(piece):
                    pass
        assert 4 * MiB < d.size <= 4 * MiB + 2 * STEP, (coding, d.size)


def test_the_decoder_stops_a_stacked_bomb_a_step_past_the_limit():
    """A gzip bomb sent through brotli (``Content-Encoding: gzip, br``): the outer layer's output is
    fed inward a step at a time, so neither layer inflates past the limit."""
    outer = brotli.Compressor(quality=1)
    d = BodyDecoder.for_headers(["gzip, br"], 4 * MiB)
    with pytest.raises(DecodedTooLarge):
        for piece in zeros_encoded("gzip", total=GiB):
            for _ in d.feed(outer.process(piece) + outer.flush()):
                pass
    assert 4 * MiB < d.size <= 4 * MiB + 2 * STEP, d.size


def test_unknown_codings_are_refused_before_anything_is_read():
    with pytest.raises(InputRejected) as refused:
        BodyDecoder.for_headers(["gzip, lz4"], 1024)
    assert refused.value.status == 415 and "'lz4'" in refused.value.message
    assert BodyDecoder.for_headers(["", " identity ,", "GZip"], 1) is not None  # case and empty elements


# -- answers: JSON gzip'd when accepted, SSE never ------------------------------------------------------------


def test_a_json_answer_is_gzipped_when_the_client_accepts_it(make_gateway: Callable[..., LiveGateway]):
    gateway = make_gateway(Settings(rate_limit_rpm=1000))
    body = {"model": MODEL, "input": "hi", "instructions": "Be brief. " * 100}
    r = httpx.post(gateway.base_url + "/responses", json=body, headers={"accept-encoding": "gzip"}, timeout=30)
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip", r.headers
    assert "accept-encoding" in r.headers["vary"].lower()
    assert r.json()["status"] == "completed" and r.num_bytes_downloaded < len(r.content)
    assert "server-timing" in r.headers and "x-ratelimit-limit-requests" in r.headers, r.headers
    plain = httpx.post(gateway.base_url + "/responses", json=body, headers={"accept-encoding": "identity"}, timeout=30)
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    small = httpx.get(gateway.url + "/healthz", headers={"accept-encoding": "gzip"}, timeout=30)
    assert small.status_code == 200 and "content-encoding" not in small.headers  # under 500 bytes: as it is


def test_an_sse_stream_is_never_compressed(gateway: LiveGateway):
    body = {"model": MODEL, "input": "hi", "stream": True, "instructions": "Be brief. " * 100}
    with httpx.stream(
        "POST", gateway.base_url + "/responses", json=body, headers={"accept-encoding": "gzip"}, timeout=30
    ) as r:
        raw = b"".join(r.iter_raw())  # the bytes as sent, not decoded by httpx
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in r.headers, r.headers
    assert parse_sse(raw)[-1]["type"] == "response.completed"


def test_gzip_responses_off_sends_json_as_it_is(make_gateway: Callable[..., LiveGateway]):
    live = make_gateway(Settings(gzip_responses=False))
    body: dict[str, Any] = {"model": MODEL, "input": "hi", "instructions": "Be brief. " * 100}
    r = httpx.post(live.base_url + "/responses", json=body, headers={"accept-encoding": "gzip"}, timeout=30)
    assert r.status_code == 200 and "content-encoding" not in r.headers, r.headers


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("br, gzip;q=0.5", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("*", True),
        ("", False),
        ("identity", False),
        ("br", False),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("*, gzip;q=0", False),  # a weight of its own wins over the wildcard
        ("*;q=0", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_gzip_is_sent_only_where_accept_encoding_accepts_it(header: str, accepted: bool):
    """RFC 9110 §12.5.3's weights, which Starlette's GZipMiddleware does not read (it looks for
    'gzip' anywhere in the header): ``gateway.transport.gzip_answers.gzip_accepted``."""
    from gateway.transport.gzip_answers import gzip_accepted

    assert gzip_accepted(header) is accepted
