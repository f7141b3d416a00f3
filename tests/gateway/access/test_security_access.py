"""Access control (issue 5, access half): API keys, tenant isolation, limits, log redaction.

Everything runs against real uvicorn servers on loopback with real clients (httpx, the openai SDK,
raw ``websockets``), real key files and a real Redis (the ``redis_url`` fixture). Each point is
shown over HTTP and over WebSocket; the Redis variants cover the multi-replica claims (revocation
and rate limits shared by two gateways on one Redis).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from gateway.access.auth import build_key_store
from gateway.base.settings import Settings
from inference.simulated import SimulatedEngine
from inference.simulated_script import Turn
from security.keys import KEY_PATTERN, FileKeyStore, KeyLimits, create_key, hash_key
from security.redact import REDACTED, RedactingFilter
from security.token_buckets import MemoryRateLimiter, Quota, RedisRateLimiter
from tests.conftest import MODEL, LiveGateway, free_port

ROOT = Path(__file__).resolve().parents[3]
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
LONG = " ".join(f"word{i}" for i in range(150))  # ~300 output tokens


# -- helpers ------------------------------------------------------------------------------------------


def settings_for(kind: str, tmp_path: Path, redis_url: str | None = None, **kw: Any) -> Settings:
    """A gateway whose key store (and response store) is a local file + memory, or Redis."""
    if kind == "redis":
        assert redis_url
        return Settings(redis_url=redis_url, keys_file=None, usage_journal=None, **kw)
    return Settings(keys_file=str(tmp_path / "keys.json"), usage_journal=None, **kw)


def issue(settings: Settings, tenant: str, **limits: Any) -> str:
    async def go() -> str:
        store = build_key_store(settings.redis_url, settings.keys_file)
        assert store is not None
        try:
            key, _ = await create_key(store, tenant, limits=KeyLimits(**limits))
            return key
        finally:
            await store.close()

    return asyncio.run(go())


def revoke(settings: Settings, key: str) -> None:
    async def go() -> None:
        store = build_key_store(settings.redis_url, settings.keys_file)
        assert store is not None
        try:
            assert await store.revoke(key) is not None
        finally:
            await store.close()

    asyncio.run(go())


def bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def post(live: LiveGateway, body: Any, key: str | None, path: str = "/responses") -> httpx.Response:
    return httpx.post(live.base_url + path, json=body, headers=bearer(key), timeout=30)


def ws_open(live: LiveGateway, key: str | None, **kw: Any) -> ClientConnection:
    return connect(live.ws_url, additional_headers=bearer(key), open_timeout=10, **kw)


def recv(ws: ClientConnection, timeout: float = 20) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def until_terminal(ws: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    while True:
        ev = recv(ws)
        frames.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return frames


def ws_create(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", **fields}))
    return until_terminal(ws)


def handshake_error(
    live: LiveGateway, key: str | None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], Any]:
    with pytest.raises(InvalidStatus) as exc:
        connect(live.ws_url, additional_headers=bearer(key) if headers is None else headers, open_timeout=10)
    resp = exc.value.response
    assert resp.headers["content-type"].startswith("application/json")
    return resp.status_code, json.loads(bytes(resp.body)), resp.headers


def assert_openai_error(body: dict[str, Any], status_type: str, code: str | None) -> dict[str, Any]:
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == status_type and err["code"] == code and err["message"], err
    return err


# == 1. API keys ======================================================================================


def test_key_format_hashing_and_file_permissions(tmp_path):
    store = FileKeyStore(str(tmp_path / "keys.json"))
    key, record = asyncio.run(create_key(store, "Acme_Corp", name="ci"))
    assert KEY_PATTERN.fullmatch(key) and key.startswith("rg-acmecorp-")
    assert len(key.rsplit("-", 1)[1]) == 43  # 256 bits of base62
    raw = (tmp_path / "keys.json").read_text()
    assert key not in raw and key.rsplit("-", 1)[1] not in raw and hash_key(key) in raw
    assert (tmp_path / "keys.json").stat().st_mode & 0o077 == 0
    found = asyncio.run(store.lookup(hash_key(key)))
    assert found is not None and found.tenant == "Acme_Corp" and found.id == record.id
    assert asyncio.run(store.lookup(hash_key(key + "x"))) is None
    with pytest.raises(ValueError):
        asyncio.run(create_key(store, "bad tenant!"))
    with pytest.raises(ValueError):
        asyncio.run(create_key(store, "acme", limits=KeyLimits(rpm=0)))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_cli_keys_create_list_revoke(kind, tmp_path, redis_url):
    where = ["--redis-url", redis_url] if kind == "redis" else ["--keys-file", str(tmp_path / "k.json")]
    made = _cli("keys", *where, "create", "--tenant", "acme", "--name", "laptop", "--rpm", "7", "--tpm", "900")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert KEY_PATTERN.fullmatch(key), made.stdout  # stdout is the key alone (scriptable)
    assert "only once" in made.stderr
    listed = _cli("keys", *where, "list")
    assert (
        listed.returncode == 0 and "acme" in listed.stdout and "laptop" in listed.stdout and "active" in listed.stdout
    )
    as_json = _cli("keys", *where, "list", "--json")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["limits"] == {"rpm": 7, "tpm": 900, "ws_connections": None}
    secret = key.rsplit("-", 1)[1]
    for out in (listed.stdout + listed.stderr, as_json.stdout + as_json.stderr):
        assert secret not in out and hash_key(key) not in out  # never the secret, nor its hash
    gone = _cli("keys", *where, "revoke", rows[0]["id"])
    assert gone.returncode == 0, gone.stderr
    assert "no active key is left" in gone.stderr and "loopback" in gone.stderr  # what a running gateway does now
    assert "revoked" in _cli("keys", *where, "list").stdout
    assert _cli("keys", *where, "revoke", "key_doesnotexist").returncode == 1
    bad = _cli("keys", *where, "create", "--tenant", "no spaces")
    assert bad.returncode == 2 and "tenant" in bad.stderr


HTTP_ROUTES = [
    ("POST", "/responses", {"model": MODEL, "input": "hi"}),
    ("GET", "/responses/resp_x", None),
    ("DELETE", "/responses/resp_x", None),
    ("POST", "/responses/resp_x/cancel", None),
    ("GET", "/responses/resp_x/input_items", None),
    ("POST", "/responses/input_tokens", {"model": MODEL, "input": "hi"}),
    ("POST", "/responses/compact", {"model": MODEL, "input": "hi"}),
    ("GET", "/models", None),
    ("GET", f"/models/{MODEL}", None),
]


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_issued_keys_guard_every_route_and_the_handshake(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url)
    key = issue(settings, "acme")
    live = make_gateway(settings)
    for headers in (
        {},
        bearer("rg-acme-" + "A" * 43),
        bearer(key + "x"),
        {"authorization": "Basic " + key},
        {"authorization": key},
        {"x-api-key": key},
    ):
        for method, path, body in HTTP_ROUTES:
            r = httpx.request(method, live.base_url + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401, (method, path, r.text)
            assert_openai_error(r.json(), "invalid_request_error", "invalid_api_key")
        status, body, _ = handshake_error(live, None, headers)
        assert status == 401
        assert_openai_error(body, "invalid_request_error", "invalid_api_key")
    assert live.engine.stats.requests == 0
    # the right key works with the official SDK over HTTP and WebSocket
    client = live.openai(api_key=key)
    assert client.responses.create(model=MODEL, input="hi").status == "completed"
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="hi")
        for ev in conn:
            assert ev.type != "error", ev
            if ev.type == "response.completed":
                break


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_revocation_applies_to_the_next_request_on_every_replica(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url)
    key = issue(settings, "acme")
    issue(settings, "beta")  # not the last key: keys stay required
    one = make_gateway(settings)
    two = make_gateway(settings) if kind == "redis" else one  # a second replica on the same Redis
    body = {"model": MODEL, "input": "hi", "store": False}
    assert post(one, body, key).status_code == 200 and post(two, body, key).status_code == 200
    ws = ws_open(two, key)
    assert ws_create(ws)[-1]["type"] == "response.completed"
    revoke(settings, key)
    for live in (one, two):
        r = post(live, body, key)
        assert r.status_code == 401
        assert_openai_error(r.json(), "invalid_request_error", "invalid_api_key")
        assert handshake_error(live, key)[0] == 401
    # the open socket: its next create gets the 401 error frame, then a clean close (1000)
    ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "again"}))
    err = recv(ws)
    assert err["type"] == "error" and err["status"] == 401 and err["error"]["code"] == "invalid_api_key"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_static_keys_with_tenants(make_gateway, tmp_path):
    live = make_gateway(
        Settings(
            api_keys=["acme:static-acme-1", "acme:static-acme-2", "loner-key"], keys_file=str(tmp_path / "none.json")
        )
    )
    made = post(live, {"model": MODEL, "input": "hi"}, "static-acme-1").json()
    same_tenant = httpx.get(f"{live.base_url}/responses/{made['id']}", headers=bearer("static-acme-2"))
    assert same_tenant.status_code == 200 and same_tenant.json()["id"] == made["id"]
    assert httpx.get(f"{live.base_url}/responses/{made['id']}", headers=bearer("loner-key")).status_code == 404
    assert post(live, {"model": MODEL, "input": "hi"}, "acme").status_code == 401  # the tenant is not a key
    with ws_open(live, "loner-key") as ws:
        assert ws_create(ws)[-1]["type"] == "response.completed"


def test_open_mode_on_loopback_until_a_key_exists(make_gateway, tmp_path):
    settings = Settings(keys_file=str(tmp_path / "keys.json"))
    live = make_gateway(settings)
    body = {"model": MODEL, "input": "hi", "store": False}
    assert post(live, body, None).status_code == 200  # single-user open mode, any or no bearer
    assert post(live, body, "anything").status_code == 200
    with ws_open(live, None) as ws:
        assert ws_create(ws)[-1]["type"] == "response.completed"
    key = issue(settings, "me")  # a key appears: keys are required now
    assert post(live, body, None).status_code == 401
    assert post(live, body, key).status_code == 200
    assert handshake_error(live, "anything")[0] == 401
    revoke(settings, key)  # the last key revoked: open again, as a restart would be here
    assert post(live, body, None).status_code == 200
    assert post(live, body, key).status_code == 200  # the revoked key is just a placeholder now


def _missing_and_incorrect(live: LiveGateway, wrong: str) -> None:
    """No bearer and a wrong bearer: both 401 ``invalid_api_key`` in OpenAI's shape, with messages
    that say which (HTTP, the WS handshake, and the SDK's ``AuthenticationError``)."""
    for headers, says in (
        ({}, "Missing API key"),
        ({"authorization": "Basic abc"}, "Missing API key"),
        (bearer(wrong), "Incorrect API key provided"),
    ):
        r = httpx.post(live.base_url + "/responses", json={"model": MODEL, "input": "hi"}, headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        err = assert_openai_error(r.json(), "invalid_request_error", "invalid_api_key")
        assert err["message"].startswith(says), err
        assert ("Authorization: Bearer" in err["message"]) == (says == "Missing API key"), err
        status, body, _ = handshake_error(live, None, headers)
        assert status == 401 and assert_openai_error(body, "invalid_request_error", "invalid_api_key")[
            "message"
        ].startswith(says)
    with pytest.raises(openai.AuthenticationError) as exc:
        live.openai(api_key=wrong).responses.create(model=MODEL, input="hi")
    assert exc.value.code == "invalid_api_key" and "Incorrect API key provided" in exc.value.message


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_401_says_whether_a_key_was_missing_or_wrong(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url)
    key = issue(settings, "acme")
    live = make_gateway(settings)
    _missing_and_incorrect(live, key + "x")
    static = make_gateway(Settings(api_keys=["acme:static-1"], keys_file=None))  # the static-keys path too
    _missing_and_incorrect(static, "static-2")


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_revoking_the_last_key_reopens_a_loopback_gateway_on_its_next_request(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url)
    one, two = issue(settings, "acme"), issue(settings, "beta")
    live = make_gateway(settings)
    body = {"model": MODEL, "input": "hi", "store": False}
    assert post(live, body, None).status_code == 401
    revoke(settings, one)  # a key is left: still closed
    assert post(live, body, None).status_code == 401 and post(live, body, one).status_code == 401
    assert post(live, body, two).status_code == 200
    revoke(settings, two)  # none left: open from the very next request
    assert post(live, body, None).status_code == 200
    with ws_open(live, None) as ws:
        assert ws_create(ws)[-1]["type"] == "response.completed"
    three = issue(settings, "gamma")  # and closed again once a key is used
    assert post(live, body, three).status_code == 200 and post(live, body, None).status_code == 401
    if kind == "file":  # deleting the key file is revoking them all
        os.remove(settings.keys_file)
        assert post(live, body, None).status_code == 200


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_revoking_the_last_key_never_opens_a_gateway_off_loopback(kind, tmp_path, redis_url, make_gateway):
    """Bound to 0.0.0.0 without ``open_mode`` (start-up would refuse to serve keyless there), the
    gateway stays closed once its last key is revoked; with ``open_mode`` it opens as start-up would."""
    closed_settings = settings_for(kind, tmp_path / "closed", redis_url, host="0.0.0.0")
    key = issue(closed_settings, "acme")
    closed = make_gateway(closed_settings)
    body = {"model": MODEL, "input": "hi", "store": False}
    assert post(closed, body, key).status_code == 200
    revoke(closed_settings, key)
    for token in (None, key, "local"):
        r = post(closed, body, token)
        assert r.status_code == 401, r.text
        assert_openai_error(r.json(), "invalid_request_error", "invalid_api_key")
    assert handshake_error(closed, None)[0] == 401
    if kind == "file":
        os.remove(closed_settings.keys_file)
        assert post(closed, body, None).status_code == 401
    else:
        asyncio.run(_flush(redis_url))  # every key gone, not just revoked
    opened_settings = settings_for(kind, tmp_path / "open", redis_url, host="0.0.0.0", open_mode=True)
    key = issue(opened_settings, "acme")
    opened = make_gateway(opened_settings)
    assert post(opened, body, None).status_code == 401
    revoke(opened_settings, key)
    assert post(opened, body, None).status_code == 200
    if kind == "redis":
        assert post(closed, body, None).status_code == 401  # the first one still refuses


async def _flush(url: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RESPGATE_CACHE_DIR": str(tmp_path),
        "RESPGATE_USAGE_JOURNAL": "",
        **(env or {}),
    }
    env.pop("REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--engine", "simulated", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("gateway did not become healthy")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.mark.slow
def test_serve_refuses_open_mode_off_loopback(tmp_path):
    port = free_port()
    refused = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port))
    out, _ = refused.communicate(timeout=60)
    assert refused.returncode == 2 and "refusing to serve on 0.0.0.0 without API keys" in out
    # explicit open mode starts; so does a gateway that has a key (and then requires it)
    opened = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port), "--open-mode")
    try:
        _wait_healthy(opened, port)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
        assert r.status_code == 200
    finally:
        _stop(opened)
    key = _cli("keys", "create", "--tenant", "acme", env={"RESPGATE_CACHE_DIR": str(tmp_path)}).stdout.strip()
    keyed = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port))
    try:
        _wait_healthy(keyed, port)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=bearer(key), timeout=10).status_code == 200
    finally:
        _stop(keyed)


# == 2. Isolation =====================================================================================


def _same_as_missing(resp: httpx.Response, missing: httpx.Response, real_id: str, fake_id: str) -> None:
    assert resp.status_code == missing.status_code
    assert resp.json() == json.loads(missing.text.replace(fake_id, real_id))


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_tenants_see_only_their_own_responses(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url)
    a1, a2, b = issue(settings, "acme"), issue(settings, "acme"), issue(settings, "beta")
    live = make_gateway(settings)
    # created over HTTP and over WS by tenant acme
    http_id = post(live, {"model": MODEL, "input": "secret plan"}, a1).json()["id"]
    with ws_open(live, a1) as ws:
        ws_id = ws_create(ws, input="ws secret")[-1]["response"]["id"]
    fake = "resp_" + "0" * 32
    base = live.base_url + "/responses/"
    for rid in (http_id, ws_id):
        for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
            missing = httpx.request(method, base + fake + suffix, headers=bearer(b))
            assert missing.status_code == 404 if suffix != "/cancel" else missing.status_code in (400, 404)
            _same_as_missing(httpx.request(method, base + rid + suffix, headers=bearer(b)), missing, rid, fake)
        # HTTP previous_response_id: exactly like an id that never existed
        missing = post(live, {"model": MODEL, "input": "x", "previous_response_id": fake}, b)
        assert missing.json()["error"]["code"] == "previous_response_not_found"
        _same_as_missing(post(live, {"model": MODEL, "input": "x", "previous_response_id": rid}, b), missing, rid, fake)
        # WS previous_response_id from tenant beta's own connection
        with ws_open(live, b) as ws:
            theirs = ws_create(ws, previous_response_id=rid)
            never = ws_create(ws, previous_response_id=fake)
        assert len(theirs) == 1 and theirs[0]["type"] == "error"
        assert theirs[0] == json.loads(json.dumps(never[0]).replace(fake, rid))
        assert theirs[0]["error"]["code"] == "previous_response_not_found"
        # the owner tenant (another of its keys) still sees it, untouched by beta's DELETE
        assert httpx.get(base + rid, headers=bearer(a2)).status_code == 200
        assert httpx.get(base + rid + "/input_items", headers=bearer(a2)).status_code == 200
        chained = post(live, {"model": MODEL, "input": "next", "previous_response_id": rid}, a2)
        assert chained.status_code == 200, chained.text


# == 3. Limits ========================================================================================


def _check_429(status: int, body: dict[str, Any], headers: Any, kind: str) -> str:
    assert status == 429
    err = assert_openai_error(body, kind, "rate_limit_exceeded")
    assert err["param"] is None
    for name in (f"x-ratelimit-limit-{kind}", f"x-ratelimit-remaining-{kind}", f"x-ratelimit-reset-{kind}"):
        assert name in headers, (name, dict(headers))
    return err["message"]


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_requests_per_minute_per_key_http_and_ws(kind, tmp_path, redis_url, make_gateway):
    settings = settings_for(kind, tmp_path, redis_url, rate_limit_rpm=1000)
    limited, other = issue(settings, "acme", rpm=2), issue(settings, "acme")  # per-key override vs default
    live = make_gateway(settings)
    body = {"model": MODEL, "input": "hi", "store": False}
    first = post(live, body, limited)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
    assert post(live, body, limited).headers["x-ratelimit-remaining-requests"] == "0"
    third = post(live, body, limited)
    message = _check_429(third.status_code, third.json(), third.headers, "requests")
    assert third.headers["x-ratelimit-remaining-requests"] == "0" and int(third.headers["retry-after"]) >= 1
    assert "Please try again in" in message
    with pytest.raises(openai.RateLimitError):  # the SDK maps it to RateLimitError
        live.openai(api_key=limited).responses.create(model=MODEL, input="hi")
    assert post(live, body, other).headers["x-ratelimit-limit-requests"] == "1000"
    # WebSocket: an error frame (429, headers inside), lane-scoped, and the socket stays open
    with ws_open(live, limited) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": "lane-a"}))
        err = recv(ws)
        assert err["type"] == "error" and err["status"] == 429 and err["stream_id"] == "lane-a"
        assert err["error"]["code"] == "rate_limit_exceeded" and err["error"]["type"] == "requests"
        assert err["error"]["headers"]["x-ratelimit-remaining-requests"] == "0"
        ws.send("{not json")
        assert recv(ws)["error"]["code"] == "invalid_json"  # still open and answering
    with ws_open(live, other) as ws:
        assert ws_create(ws)[-1]["type"] == "response.completed"


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_tokens_per_minute_reconciled_after_the_turn(kind, tmp_path, redis_url, make_gateway):
    engine = SimulatedEngine(script=lambda view: Turn(text=LONG))
    settings = settings_for(kind, tmp_path, redis_url)
    live = make_gateway(settings, engine=engine)
    body = {"model": MODEL, "input": "hi", "store": False}
    counted = httpx.post(live.base_url + "/responses/input_tokens", json={"model": MODEL, "input": "hi"})
    prompt = counted.json()["input_tokens"]
    tpm = 2 * prompt + 40  # two prompts fit; prompt + ~300 output do not
    key, ws_key = issue(settings, "acme", tpm=tpm), issue(settings, "acme", tpm=tpm)
    tiny = issue(settings, "acme", tpm=prompt - 1)
    first = post(live, body, key)
    assert first.status_code == 200 and first.json()["usage"]["output_tokens"] > 200
    assert first.headers["x-ratelimit-limit-tokens"] == str(tpm)
    live.call(live.gw.access.flush())  # the reconciliation has landed
    second = post(live, body, key)
    message = _check_429(second.status_code, second.json(), second.headers, "tokens")
    assert second.headers["x-ratelimit-remaining-tokens"] == "0" and "try again in" in message
    too_big = post(live, body, tiny)
    assert "Request too large" in _check_429(too_big.status_code, too_big.json(), too_big.headers, "tokens")
    assert "retry-after" not in too_big.headers
    with ws_open(live, ws_key) as ws:
        assert ws_create(ws)[-1]["type"] == "response.completed"
        live.call(live.gw.access.flush())
        err = ws_create(ws)
        assert len(err) == 1 and err[0]["status"] == 429 and err[0]["error"]["type"] == "tokens"
        assert err[0]["error"]["code"] == "rate_limit_exceeded"
        ws.send("[]")
        assert recv(ws)["type"] == "error"  # the socket stays open


def test_rate_limits_are_shared_and_atomic_across_replicas(redis_url, make_gateway, tmp_path):
    settings = settings_for("redis", tmp_path, redis_url)
    key = issue(settings, "acme", rpm=3)
    one, two = make_gateway(settings), make_gateway(settings)
    body = {"model": MODEL, "input": "hi", "store": False}
    codes = [post(live, body, key).status_code for live in (one, two, one, two)]
    assert codes == [200, 200, 200, 429]

    async def burst() -> tuple[int, float]:
        # 2 "replicas" (2 clients) x 60 concurrent attempts on a fresh bucket of 20
        limiters = [RedisRateLimiter.from_url(redis_url), RedisRateLimiter.from_url(redis_url)]
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(limiters[i % 2].acquire("burst", Quota(rpm=20), requests=1) for i in range(120))
        )
        elapsed = time.monotonic() - t0
        for lim in limiters:
            await lim.close()
        return sum(d.allowed for d in results), elapsed

    allowed, elapsed = asyncio.run(burst())
    assert 20 <= allowed <= 20 + int(elapsed * 20 / 60) + 1  # never more than the bucket + its refill


def test_memory_bucket_refill_debt_and_retry_after():
    now = [1000.0]
    lim = MemoryRateLimiter(clock=lambda: now[0])
    q = Quota(rpm=60, tpm=600)

    async def go() -> None:
        d = await lim.acquire("k", q, requests=1)
        assert d.allowed and d.remaining("requests") == 59 and d.remaining("tokens") == 600
        d = await lim.acquire("k", q, tokens=500)
        assert d.allowed and d.remaining("tokens") == 100
        await lim.adjust("k", q, 300)  # output tokens: 200 in debt
        d = await lim.acquire("k", q, requests=1)
        assert not d.allowed and d.refused == "tokens" and d.retry_after_s == pytest.approx(20.1)
        now[0] += 21  # 210 tokens refilled: out of debt
        d = await lim.acquire("k", q, requests=1)
        assert d.allowed and d.reset_s("tokens") == pytest.approx((600 - 10) / 10)
        assert not (await lim.acquire("k", q, tokens=601)).allowed  # larger than the limit: never
        assert (await lim.acquire("k", q, tokens=601)).retry_after_s == float("inf")

    asyncio.run(go())


def test_ws_connections_per_key(make_gateway, tmp_path):
    settings = settings_for("file", tmp_path, ws_max_connections_per_key=5)
    two, other = issue(settings, "acme", ws_connections=2), issue(settings, "acme")
    live = make_gateway(settings)
    a, b = ws_open(live, two), ws_open(live, two)
    status, body, _ = handshake_error(live, two)
    assert status == 429
    assert_openai_error(body, "requests", "rate_limit_exceeded")
    with ws_open(live, other) as c:  # another key is not affected
        assert ws_create(c)[-1]["type"] == "response.completed"
    a.close()
    deadline = time.monotonic() + 20  # the server notices the close
    while True:
        try:
            d = ws_open(live, two)
            break
        except InvalidStatus:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert ws_create(d)[-1]["type"] == "response.completed"
    b.close()
    d.close()


def test_ws_queued_creates_lanes_and_frame_size(make_gateway):
    engine = SimulatedEngine(decode_tps=200, script=lambda view: Turn(text=LONG))
    live = make_gateway(
        Settings(ws_max_queued=3, ws_max_lanes=2, max_request_bytes=4096, keys_file=None), engine=engine
    )
    with ws_open(live, None) as ws:
        for i in range(5):
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": f"q{i}", "store": False}))
        errors, done = [], []
        while len(errors) + len(done) < 5:
            ev = recv(ws, timeout=60)
            if ev["type"] == "error":
                errors.append(ev)
            elif ev["type"] in TERMINAL:
                done.append(ev)
        assert len(done) == 3 and all(e["type"] == "response.completed" for e in done)
        assert [e["status"] for e in errors] == [429, 429]
        assert all(e["error"]["code"] == "rate_limit_exceeded" and "queued" in e["error"]["message"] for e in errors)
        # lanes: the third distinct stream_id is refused (configured limit 2)
        for lane in ("a", "b", "c"):
            ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "input": "x",
                        "stream_id": lane,
                        "max_output_tokens": 16,
                    }
                )
            )
        seen = {}
        while len(seen) < 3:
            ev = recv(ws, timeout=60)
            if ev["type"] in TERMINAL or ev["type"] == "error":
                seen[ev.get("stream_id")] = ev
        assert seen["c"]["type"] == "error" and seen["c"]["error"]["code"] == "websocket_stream_limit_reached"
        assert seen["a"]["type"] != "error" and seen["b"]["type"] != "error"
        # frame size: an oversized frame gets a 413 error frame and the socket keeps working
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 5000}))
        err = recv(ws)
        assert err["status"] == 413 and err["error"]["code"] == "request_too_large"
        assert ws_create(ws, max_output_tokens=16)[-1]["type"] in ("response.completed", "response.incomplete")
    r = httpx.post(
        live.base_url + "/responses",
        content=b'{"input": "' + b"x" * 5000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_ws_idle_timeout_closes_cleanly_but_not_while_generating(make_gateway):
    engine = SimulatedEngine(decode_tps=100, script=lambda view: Turn(text=LONG))
    live = make_gateway(Settings(ws_idle_timeout_s=0.5, keys_file=None), engine=engine)
    with ws_open(live, None) as ws:
        # a generation far longer than the idle timeout runs to completion
        frames = ws_create(ws, store=False)
        assert frames[-1]["type"] == "response.completed" and len(frames) > 100
        err = recv(ws, timeout=30)  # then, idle: error frame + 1000
        assert err["type"] == "error" and err["error"]["code"] == "websocket_idle_timeout"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_ws_cached_state_is_bounded_per_connection(make_gateway):
    live = make_gateway(Settings(ws_cache_bytes=1, keys_file=None))
    with ws_open(live, None) as ws:
        first = ws_create(ws, store=False, stream_id="a")[-1]["response"]["id"]
        second = ws_create(ws, store=False, stream_id="b")[-1]["response"]["id"]
        # over the byte budget, the least recently used lane's state was dropped, the newest kept
        gone = ws_create(ws, store=False, stream_id="a", previous_response_id=first)
        assert gone[-1]["type"] == "error" and gone[-1]["error"]["code"] == "previous_response_not_found"
        kept = ws_create(ws, store=False, stream_id="b", previous_response_id=second)
        assert kept[-1]["type"] == "response.completed"


# == 5. Logs never contain keys =======================================================================


def test_redacting_filter_scrubs_records():
    flt = RedactingFilter(["static-secret-value"])
    key = "rg-acme-" + "Z" * 43
    handler_records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            handler_records.append(self.format(record))

    log = logging.getLogger("test.redact")
    handler = Capture()
    handler.addFilter(flt)
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("< %s: %s", "Authorization", f"Bearer {key}")
        log.warning(
            '%s - "GET /v1/responses/%s?api_key=%s HTTP/1.1" %d', "127.0.0.1:1", key, "static-secret-value", 404
        )
        log.warning("headers=%r", [(b"x-api-key", b"static-secret-value"), (b"authorization", b"Basic abc123")])
        try:
            raise ValueError(f"bad key {key}")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    text = "\n".join(handler_records)
    assert key not in text and "static-secret-value" not in text and "abc123" not in text
    assert text.count(REDACTED) >= 5 and " 404" in text  # numbers still format


@pytest.mark.slow
def test_serve_logs_capture_no_key(tmp_path):
    """A real ``respgate serve`` at DEBUG, fed keys in every wrong place; its whole output is checked."""
    env = {"RESPGATE_CACHE_DIR": str(tmp_path)}
    issued = _cli("keys", "create", "--tenant", "acme", env=env).stdout.strip()
    revoked = _cli("keys", "create", "--tenant", "acme", env=env).stdout.strip()
    _cli("keys", "revoke", revoked, env=env)
    static = "StaticKey-0123456789abcdef"
    secrets = [issued, revoked, static, issued.rsplit("-", 1)[1], revoked.rsplit("-", 1)[1]]
    port = free_port()
    proc = _serve(tmp_path, "--port", str(port), "--log-level", "debug", "--api-key", f"ops:{static}")
    try:
        _wait_healthy(proc, port)
        base = f"http://127.0.0.1:{port}/v1"
        body = {"model": "gpt-oss-sim", "input": "hi", "store": False}
        with httpx.Client(timeout=30) as c:
            for key in (issued, revoked, static):
                for headers in (
                    {"authorization": f"Bearer {key}"},
                    {"authorization": f"Basic {key}"},
                    {"authorization": f"Bearer {key} trailing junk"},
                    {"x-api-key": key},
                    {"authorization": key},
                    {"api-key": key},
                ):
                    c.post(base + "/responses", json=body, headers=headers)
                c.get(f"{base}/responses/{key}", headers={"authorization": f"Bearer {issued}"})
                c.get(f"{base}/models?api_key={key}")
                c.post(
                    base + "/responses",
                    content=b'{"model": "' + key.encode() + b'", "input": 1',
                    headers={"authorization": f"Bearer {key}"},
                )
                for headers in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):
                    try:
                        with connect(
                            f"ws://127.0.0.1:{port}/v1/responses?key={key}", additional_headers=headers, open_timeout=10
                        ) as ws:
                            ws.send(json.dumps({"type": "response.create", "model": key, "input": key}))
                            ws.recv(timeout=20)
                    except InvalidStatus:
                        pass
    finally:
        out = _stop(proc)
    assert "/v1/responses" in out and REDACTED in out, out[-3000:]  # the requests were logged, scrubbed
    for secret in secrets:
        assert secret not in out, f"secret leaked into the logs: {secret[:12]}..."


@pytest.mark.parametrize("content", [b"[]", b'"keys"', b"3", b'{"keys": {}}', b'{"keys": [1]}', b'{"keys": "x"}'])
def test_a_key_file_of_another_shape_is_the_store_unavailable_not_a_crash(tmp_path, content):
    """A hand-edited or foreign key file is a key store that cannot be read (auth answers 503 and
    stays closed), never an AttributeError escaping from every refused request (review of issue 28)."""
    from security.keys import KeyStoreUnavailable

    path = tmp_path / "keys.json"
    path.write_bytes(content)
    with pytest.raises(KeyStoreUnavailable, match="cannot read key file"):
        FileKeyStore(str(path)).count_active_sync()
