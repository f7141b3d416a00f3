"""Who is calling: bearer keys -> a principal (tenant, key id, per-key limits), for HTTP and WS alike.

Keys come from two places: a static list in settings (``KEY`` or ``TENANT:KEY``; a bare key is its
own tenant, named by a digest so stores never hold the key) and the key store (``respgate keys``:
a local file, or Redis with ``redis_url``). Lookups go by ``sha256(key)`` (see ``security/keys.py``).

**Open mode.** With no key anywhere, the gateway is a single-user tool: every request is the
anonymous principal (tenant ``None``). That is only safe on loopback, so start-up refuses any other
address unless ``open_mode`` is set explicitly. Once a key exists (say, ``respgate keys create``
against a running gateway's file), keys are required from the next request on.

**Back to open mode.** When the last store key is revoked (or the key file is deleted) and no static
key is configured, a running gateway returns to open mode exactly where start-up would have allowed
it: bound to a loopback address, or started with ``open_mode``. There a restart would come up open
anyway, so staying closed only made the gateway answer 401 to everyone until someone restarted it.
Anywhere else the gateway stays closed for the life of the process (a revocation must never open a
gateway that others can reach; start-up would refuse it): every request is a 401 until a key is
created. The file store's count is a ``stat`` per check; Redis's is one ``SCARD``, made on a request
that is about to be refused (so a key-holding caller never pays for it) or, in open mode, at most
once per ``COUNT_TTL_S``.

**Why a 401.** No bearer token at all, and a token that is no key here (unknown, revoked), get
different messages with the same OpenAI shape (``invalid_request_error`` / ``invalid_api_key``, which
openai-python raises as ``AuthenticationError``): a client that forgot its key is told to send one,
not that the one it did not send is wrong. Neither message says whether a key once existed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.wire.errors import ApiError
from security.keys import (
    KEY_PATTERN,
    TENANT,
    FileKeyStore,
    KeyLimits,
    KeyStore,
    KeyStoreUnavailable,
    RedisKeyStore,
    hash_key,
)


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str | None
    #: public key handle (rate-limit subject, connection counts); None = anonymous (open mode)
    key_id: str | None
    limits: KeyLimits = field(default_factory=KeyLimits)
    #: set for store-issued keys, which can be revoked while a WebSocket is open
    key_hash: str | None = None

    @property
    def subject(self) -> str:
        return self.key_id or "anonymous"


ANONYMOUS = Principal(tenant=None, key_id=None)


class OpenModeRefused(RuntimeError):
    """No keys configured and the bind address is not loopback."""


def key_store_unavailable() -> ApiError:
    return ApiError(
        503,
        "The API key store is temporarily unavailable. Please retry your request.",
        type="server_error",
        code="server_is_overloaded",
    )


def missing_api_key() -> ApiError:
    """401 for a request that sent no bearer token (or one in another scheme) where keys are required."""
    return ApiError(
        401,
        "Missing API key: this gateway requires one. Send it in an Authorization header using "
        "Bearer auth (Authorization: Bearer YOUR_KEY; the OpenAI SDKs send their api_key so). "
        "Keys are issued with `respgate keys create`.",
        code="invalid_api_key",
        headers={"www-authenticate": 'Bearer realm="respgate"'},
    )


def incorrect_api_key() -> ApiError:
    """401 for a bearer token that is no active key here (unknown or revoked: not told apart)."""
    return ApiError(
        401,
        "Incorrect API key provided: the bearer token is not an active API key of this gateway (unknown, or revoked).",
        code="invalid_api_key",
        headers={"www-authenticate": 'Bearer realm="respgate", error="invalid_token"'},
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _static_principal(entry: str) -> tuple[str, Principal]:
    tenant, sep, key = entry.partition(":")
    if not (sep and key and TENANT.fullmatch(tenant)):
        key, tenant = entry, "t_" + hashlib.sha256(entry.encode()).hexdigest()[:24]
    digest = hash_key(key)
    return digest, Principal(tenant=tenant, key_id="static_" + digest[:12])


class KeyAuth:
    #: how long "are there any keys?" is cached while in open mode with a Redis store
    COUNT_TTL_S = 1.0

    def __init__(
        self,
        keys: list[str],
        store: KeyStore | None = None,
        *,
        open_mode: bool = False,
        allowed_origins: list[str] | tuple[str, ...] = (),
    ) -> None:
        """``allowed_origins``: browser origins (``scheme://host[:port]``, or ``*``) whose pages may call
        the gateway; a request or handshake carrying any other ``Origin`` is refused (403)."""
        self._static: dict[str, Principal] = dict(_static_principal(k) for k in keys if k)
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self._secrets = [k.partition(":")[2] if ":" in k else k for k in keys]
        self.store = store
        self.open_mode = open_mode
        #: whether open mode may resume once no key is left: start-up's rule, known from ``check_startup``
        #: (until then only an explicit ``open_mode`` allows it)
        self.may_reopen = open_mode
        self._required = bool(self._static)
        self._count_checked = 0.0

    @property
    def enabled(self) -> bool:
        return self._required

    @property
    def static_secrets(self) -> list[str]:
        """Literal static keys (for the log redaction filter: they can have any shape)."""
        return [s for s in self._secrets if s]

    async def keys_required(self, *, fresh: bool = False) -> bool:
        """Whether a request must carry a key now (see "Back to open mode" in the module docstring).
        ``fresh``: re-count a Redis store now rather than within ``COUNT_TTL_S``."""
        if self._static:
            return True
        if self.store is None:
            return False
        if self._required and not self.may_reopen:
            return True  # a key existed, and open mode may not resume here
        if isinstance(self.store, FileKeyStore):
            try:
                self._required = self.store.count_active_sync() > 0
            except KeyStoreUnavailable:
                self._required = True  # a key file exists but is unreadable: fail closed
            return self._required
        now = time.monotonic()
        if fresh or now - self._count_checked >= self.COUNT_TTL_S:
            try:
                self._required = await self.store.count_active() > 0
                self._count_checked = now
            except KeyStoreUnavailable:
                pass  # the store is down: stay as we were (closed stays closed, open stays open)
        return self._required

    def check_origin(self, headers: Mapping[str, str]) -> None:
        """Refuse a request a browser page sent from an origin not listed in ``allowed_origins``.

        Why: a page the user opens can make the browser send a WebSocket handshake or a "simple"
        (no-preflight) POST to a gateway on 127.0.0.1; without keys (the loopback default) nothing
        else would stop it from driving the gateway. Browsers always send ``Origin`` on those;
        SDKs, Codex and curl send none, so they are unaffected."""
        origin = headers.get("origin")
        if origin is None or "*" in self.allowed_origins or origin.rstrip("/").lower() in self.allowed_origins:
            return
        raise ApiError(
            403,
            f"Requests from the browser origin '{origin[:200]}' are not allowed. "
            "List it in allowed_origins (RESPGATE_ALLOWED_ORIGINS) to let its pages call this gateway.",
            type="invalid_request_error",
            code="origin_not_allowed",
        )

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller's principal, or ``ApiError`` 401 (no key / not a key) / 403 (a browser origin
        not allowed) / 503 (key store down)."""
        self.check_origin(headers)
        token = _bearer(headers)
        if token is not None:
            digest = hash_key(token)
            principal = self._static.get(digest)
            if principal is not None:
                return principal
            # In open mode only key-shaped tokens are looked up (SDK placeholders like "local" cost no
            # store round trip), so a key issued a moment ago works before the key count is re-read.
            if self.store is not None and (self._required or KEY_PATTERN.fullmatch(token)):
                try:
                    record = await self.store.lookup(digest)
                except KeyStoreUnavailable:
                    raise key_store_unavailable() from None
                if record is not None:
                    self._required = True
                    return Principal(tenant=record.tenant, key_id=record.id, limits=record.limits, key_hash=digest)
        # about to refuse: re-count now (was the last key just revoked?); open mode re-reads lazily
        if await self.keys_required(fresh=self._required):
            raise missing_api_key() if token is None else incorrect_api_key()
        return ANONYMOUS

    async def still_valid(self, principal: Principal) -> bool:
        """Whether a store-issued key is still active (WebSocket creates re-check: revocation)."""
        if principal.key_hash is None or self.store is None:
            return True
        try:
            return await self.store.lookup(principal.key_hash) is not None
        except KeyStoreUnavailable:
            return True  # a store blip must not kill live sockets; new connections fail closed

    def tenant(self, headers: Mapping[str, str]) -> str | None:
        """Static keys only (no store): the caller's tenant, or ``ApiError(401)``."""
        if not self._static:
            return None
        token = _bearer(headers)
        if token is None:
            raise missing_api_key()
        principal = self._static.get(hash_key(token))
        if principal is None:
            raise incorrect_api_key()
        return principal.tenant

    async def check_startup(self, host: str) -> None:
        """Refuse open mode off loopback (``OpenModeRefused``); remember whether it may resume later."""
        self.may_reopen = self.open_mode or is_loopback(host)
        if self.may_reopen or await self.keys_required():
            return
        raise OpenModeRefused(
            f"refusing to serve on {host} without API keys: anyone who can reach this address could use "
            f"the gateway. Create a key (respgate keys create --tenant NAME), set RESPGATE_API_KEYS, bind to "
            f"127.0.0.1, or pass --open-mode (RESPGATE_OPEN_MODE=1) to serve without authentication."
        )

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def build_key_store(redis_url: str | None, keys_file: str | None) -> KeyStore | None:
    """Redis when the gateway shares state through Redis, else the local key file (if configured)."""
    if redis_url:
        return RedisKeyStore.from_url(redis_url)
    if keys_file:
        return FileKeyStore(keys_file)
    return None
