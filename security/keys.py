"""API keys: generation, hashing, and the key stores (a local file, or Redis shared by replicas).

A key looks like ``rg-<tenant hint>-<43 base62 characters>``. The hint only helps a human tell keys
apart in a config file; the tenant a key belongs to is the one recorded in its store entry.

**Why plain SHA-256 is the right hash here.** Stores keep ``sha256(key)``, never the key. Slow,
salted password hashes (bcrypt, scrypt, argon2) exist because human passwords are guessable: an
attacker holding the hashes tries a dictionary, and salts stop one table from cracking every user at
once. Our keys are 256 random bits from ``secrets`` (``43 * log2(62)`` > 256): there is nothing to
guess, so a leaked hash is no closer to the key than a random string, with or without a salt or a
slow hash. An unsalted fast hash also lets a request find its key with one lookup by hash (a
per-key salt would mean hashing the presented key once per stored key), and looking up by hash
means the comparison never touches secret bytes, so there is no timing oracle to worry about.

**Revocation.** The file store re-reads its file whenever ``stat`` says it changed (checked on
every lookup: a syscall, no read), so ``respgate keys revoke`` applies to the very next request.
The Redis store reads the entry on every lookup, so a revoke applies to the next request on every
replica. Revoked entries stay listed (with their revocation time) for audit, but never authenticate.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import string
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

KEY_PREFIX = "rg"
_ALPHABET = string.ascii_letters + string.digits
_SECRET_CHARS = 43  # 43 * log2(62) = 256.1 bits
#: tenants are identifiers that end up in stores, ledgers and reports
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
#: what a generated key looks like (also used by the log redaction filter)
KEY_PATTERN = re.compile(r"rg-[a-z0-9]{0,16}-[A-Za-z0-9]{20,}")


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """Per-key overrides of the gateway's defaults; ``None`` = use the default."""

    rpm: int | None = None
    tpm: int | None = None
    ws_connections: int | None = None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str  # public handle for list/revoke, e.g. key_3f9c2a...
    tenant: str
    hash: str  # sha256(key), hex
    name: str = ""
    created_at: float = 0.0
    limits: KeyLimits = field(default_factory=KeyLimits)
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyRecord:
        limits = KeyLimits(**(data.get("limits") or {}))
        return cls(
            id=data["id"],
            tenant=data["tenant"],
            hash=data["hash"],
            name=data.get("name", ""),
            created_at=float(data.get("created_at", 0.0)),
            limits=limits,
            revoked_at=data.get("revoked_at"),
        )


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def tenant_hint(tenant: str) -> str:
    return re.sub(r"[^a-z0-9]", "", tenant.lower())[:16]


def generate_key(tenant: str) -> str:
    secret = "".join(secrets.choice(_ALPHABET) for _ in range(_SECRET_CHARS))
    return f"{KEY_PREFIX}-{tenant_hint(tenant)}-{secret}"


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
        raise ValueError(
            "tenant must be 1-64 characters: letters, digits, '_', '.', '@', '-' (starting with a letter or digit)"
        )
    return tenant


def new_record(tenant: str, name: str = "", limits: KeyLimits | None = None) -> tuple[str, KeyRecord]:
    """A fresh key and its record (the key itself is returned once and stored nowhere)."""
    check_tenant(tenant)
    limits = limits or KeyLimits()
    for f in fields(limits):
        v = getattr(limits, f.name)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{f.name} must be a positive integer")
    key = generate_key(tenant)
    record = KeyRecord(
        id="key_" + secrets.token_hex(8),
        tenant=tenant,
        hash=hash_key(key),
        name=name,
        created_at=time.time(),
        limits=limits,
    )
    return key, record


class KeyStore(Protocol):
    """Where issued keys live. ``lookup`` is on the request path; the rest is administration."""

    async def lookup(self, key_hash: str) -> KeyRecord | None:
        """The active record for that hash, else None (unknown or revoked)."""
        ...

    async def add(self, record: KeyRecord) -> None: ...

    async def list(self) -> list[KeyRecord]: ...

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke by id (or by the key itself); returns the revoked record, None if unknown."""
        ...

    async def count_active(self) -> int: ...

    async def close(self) -> None: ...


async def create_key(
    store: KeyStore, tenant: str, name: str = "", limits: KeyLimits | None = None
) -> tuple[str, KeyRecord]:
    key, record = new_record(tenant, name, limits)
    await store.add(record)
    return key, record


class KeyStoreUnavailable(Exception):
    """The key store cannot be read (Redis down, unreadable file): authenticate nobody (fail closed)."""


# -- local file -------------------------------------------------------------------------------------


class FileKeyStore:
    """Keys in one JSON file (mode 0600), for single-host set-ups.

    Writes go through a lock file and an atomic rename, so concurrent ``respgate keys`` commands
    cannot lose each other's keys and a reader never sees half a file. Readers keep the parsed file
    and re-read it when its (inode, size, mtime) changes.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self._stamp: tuple[int, int, int] | None = None
        self._records: dict[str, KeyRecord] = {}  # id -> record
        self._by_hash: dict[str, KeyRecord] = {}

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._records, self._by_hash = None, {}, {}
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read() or b'{"keys": []}')
            if not isinstance(data, dict) or not isinstance(data.get("keys", []), list):
                raise ValueError('not an object with a "keys" list')
            records = [KeyRecord.from_json(r) for r in data.get("keys", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyStoreUnavailable(f"cannot read key file {self.path}: {exc}") from exc
        self._records = {r.id: r for r in records}
        self._by_hash = {r.hash: r for r in records if r.active}
        self._stamp = stamp

    def lookup_sync(self, key_hash: str) -> KeyRecord | None:
        self._refresh()
        return self._by_hash.get(key_hash)

    async def lookup(self, key_hash: str) -> KeyRecord | None:
        return self.lookup_sync(key_hash)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._stamp = None  # re-read under the lock
            self._refresh()
            yield
        finally:
            os.close(fd)

    def _write(self) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"keys": [r.to_json() for r in self._records.values()]}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._stamp = None

    async def add(self, record: KeyRecord) -> None:
        with self._locked():
            self._records[record.id] = record
            self._write()

    async def list(self) -> list[KeyRecord]:
        self._refresh()
        return sorted(self._records.values(), key=lambda r: r.created_at)

    async def revoke(self, key_id: str) -> KeyRecord | None:
        with self._locked():
            record = self._find(key_id)
            if record is None:
                return None
            if record.active:
                record = replace(record, revoked_at=time.time())
                self._records[record.id] = record
                self._write()
            return record

    def _find(self, key_id: str) -> KeyRecord | None:
        if key_id in self._records:
            return self._records[key_id]
        digest = hash_key(key_id)
        return next((r for r in self._records.values() if r.hash == digest), None)

    def count_active_sync(self) -> int:
        self._refresh()
        return len(self._by_hash)

    async def count_active(self) -> int:
        return self.count_active_sync()

    async def close(self) -> None:
        pass


# -- Redis ------------------------------------------------------------------------------------------


class RedisKeyStore:
    """Keys shared by every replica: ``{prefix}key:{hash}`` -> record JSON, plus an id index.

    ``{prefix}keys`` maps id -> hash (for list and revoke by id); ``{prefix}keys:active`` is the set
    of active ids (its size says whether the gateway has any keys at all).

    Redis Cluster: the three keys hash to different slots, so a change is not one transaction but
    two steps in the order that fails closed: ``add`` counts the key active before its record makes
    it valid, ``revoke`` invalidates the record before uncounting it. Interrupted in between, the
    gateway at worst believes a key exists that does not authenticate (never the open mode with a
    valid key, never a revoked key that still works). ``list`` reads records with one pipelined
    ``GET`` each (any slot), not ``MGET``.
    """

    def __init__(self, client: Any, prefix: str = "respgate:") -> None:
        self.redis = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = "respgate:") -> RedisKeyStore:
        # the stores' client, like the response store: one quick retry (a stale pooled connection
        # after a Redis restart), an outage surfaces in seconds
        from cache.redis_client import connect_store

        return cls(connect_store(url), prefix)

    def _k(self, key_hash: str) -> str:
        return f"{self.prefix}key:{key_hash}"

    async def _call(self, coro: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            raise KeyStoreUnavailable(f"key store unreachable: {exc}") from exc

    async def lookup(self, key_hash: str) -> KeyRecord | None:
        raw = await self._call(self.redis.get(self._k(key_hash)))
        if raw is None:
            return None
        record = KeyRecord.from_json(json.loads(raw))
        return record if record.active else None

    async def add(self, record: KeyRecord) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(f"{self.prefix}keys", record.id, record.hash)
        pipe.sadd(f"{self.prefix}keys:active", record.id)
        await self._call(pipe.execute())
        await self._call(self.redis.set(self._k(record.hash), json.dumps(record.to_json())))

    async def list(self) -> list[KeyRecord]:
        index = await self._call(self.redis.hgetall(f"{self.prefix}keys"))
        if not index:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key_hash in index.values():
            pipe.get(self._k(key_hash.decode()))
        raws = await self._call(pipe.execute())
        records = [KeyRecord.from_json(json.loads(r)) for r in raws if r is not None]
        return sorted(records, key=lambda r: r.created_at)

    async def revoke(self, key_id: str) -> KeyRecord | None:
        key_hash = await self._call(self.redis.hget(f"{self.prefix}keys", key_id))
        key_hash = key_hash.decode() if key_hash is not None else hash_key(key_id)
        raw = await self._call(self.redis.get(self._k(key_hash)))
        if raw is None:
            return None
        record = KeyRecord.from_json(json.loads(raw))
        if record.active:
            record = replace(record, revoked_at=time.time())
            await self._call(self.redis.set(self._k(key_hash), json.dumps(record.to_json())))
            await self._call(self.redis.srem(f"{self.prefix}keys:active", record.id))
        return record

    async def count_active(self) -> int:
        return int(await self._call(self.redis.scard(f"{self.prefix}keys:active")))

    async def close(self) -> None:
        await self.redis.aclose()
