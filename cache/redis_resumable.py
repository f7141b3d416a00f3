"""A closed WebSocket's ``store=false`` lane state as a sealed, short-lived Redis record.

Why: with ``ws_resume_window_s`` and ``ws_resume_redis`` set, a socket that drops (a network blip,
a rolling update's close 1001) may be replaced by one that a load balancer sends to *another*
replica. That replica never saw the chain (``store=false``: nothing is in the response store), so
the replica that held the connection leaves each lane's latest state here for the grace window.

What a record holds: the Response object, the response's own input items, the chain's items (the
whole context, the input the next turn is rendered from), model, pending tool calls, the flag bit
and the byte counts — never the rendered token ids (the taking replica renders the items once,
``render_full_fallbacks{reason="tokens_missing"}``, the same hand-over as a ``store=true`` chain
read from the Redis store) and never classifier verdicts (they stay with the turn that made them).

How it is kept: one string key per response, ``{prefix}wsr:{tenant tag}:{response id}``, written
with ``PX`` = the window, so Redis drops it on its own when nobody takes it; no other key, no
index, nothing with a longer life. The value is the JSON above sealed by the gateway's
:class:`~gateway.turn.sealing.Sealer` (compressed, masked with a keystream of the server secret
and a random nonce, HMAC-authenticated): Redis, its persistence files and its replicas see an
opaque blob, and a replica without the same secret cannot open it. The sealed JSON repeats the
tenant and the response id, checked on open, so a record copied under another key opens as
nothing.

Claimed once: :meth:`take` is ``GETDEL`` (one atomic step: of two replicas racing for a record one
gets it, the other ``None``); :meth:`discard` is ``DEL`` and says whether it removed the key, which
is how the replica that also holds the state in memory learns whether it won. Single-key commands
only, so the layout is Redis Cluster-safe as it is.

Redis errors become :class:`ResumeUnavailable`; the caller decides (keep memory only, or answer as
if nothing was kept).
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import orjson
from redis.exceptions import RedisError

from cache.item_log import ItemLog
from cache.redis_client import AsyncClient, connect_store
from cache.response_state import ResponseState
from cache.seq import TokenSeq

#: format of the sealed JSON (bumped when its fields change; an unknown version opens as nothing)
VERSION = 1


class Seal(Protocol):
    """The sealing the gateway uses for encrypted reasoning (``gateway.turn.sealing.Sealer``);
    ``open`` raises ``ValueError`` on a blob it did not seal."""

    def seal(self, text: str) -> str: ...

    def open(self, blob: str) -> str: ...


class ResumeUnavailable(Exception):
    """Redis did not answer: the record could not be written, taken or discarded."""


def encode(state: ResponseState, tenant: str | None) -> str:
    """The record's plain JSON (before sealing)."""
    return orjson.dumps(
        {
            "v": VERSION,
            "id": state.id,
            "tenant": tenant,
            "response": state.response,
            "input": list(state.input_items),
            "context": list(state.context),
            "model": state.model,
            "store": state.store,
            "parent_id": state.parent_id,
            "pending_calls": sorted(state.pending_calls),
            "flagged": state.flagged,
            "nbytes": state.nbytes,
            "delta_bytes": state.delta_bytes,
            "created": state.created,
        }
    ).decode()


def decode(text: str, response_id: str, tenant: str | None) -> ResponseState | None:
    """The state a record holds, or None when it is not the record of ``response_id`` for ``tenant``.
    No token ids and ``prelude_key=b""``: the taking replica renders the context in full once."""
    try:
        rec: dict[str, Any] = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if rec.get("v") != VERSION or rec.get("id") != response_id or rec.get("tenant") != tenant:
        return None
    return ResponseState(
        id=response_id,
        response=rec["response"],
        input_items=tuple(rec["input"]),
        context=ItemLog(rec["context"]),
        history_ids=TokenSeq(),
        model=rec["model"],
        prelude_key=b"",
        store=rec["store"],
        parent_id=rec["parent_id"],
        pending_calls=frozenset(rec["pending_calls"]),
        flagged=rec["flagged"],
        tenant=tenant,
        nbytes=rec["nbytes"],
        delta_bytes=rec["delta_bytes"],
        created=rec["created"],
    )


class RedisResumable:
    """Sealed resumable states in Redis; see the module docstring for what is kept and for how long."""

    def __init__(self, client: AsyncClient, sealer: Seal, *, prefix: str = "respgate:") -> None:
        self.redis = client
        self.sealer = sealer
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, sealer: Seal, *, prefix: str = "respgate:", **client_kwargs: Any) -> RedisResumable:
        # the stores' client settings: an outage surfaces in seconds, one quick retry
        return cls(connect_store(url, **client_kwargs), sealer, prefix=prefix)

    def key(self, response_id: str, tenant: str | None) -> str:
        tag = hashlib.blake2b(orjson.dumps(tenant), digest_size=8).hexdigest()
        return f"{self.prefix}wsr:{tag}:{response_id}"

    def seal(self, state: ResponseState, tenant: str | None) -> str:
        """CPU only (JSON + sealing: O(context)); the caller may run it off the event loop."""
        return self.sealer.seal(encode(state, tenant))

    async def put(self, response_id: str, tenant: str | None, blob: str, ttl_s: float) -> None:
        try:
            await self.redis.set(self.key(response_id, tenant), blob, px=max(1, int(ttl_s * 1000)))
        except RedisError as exc:
            raise ResumeUnavailable(f"resumable state write failed: {exc}") from exc

    async def take(self, response_id: str, tenant: str | None) -> str | None:
        """The sealed record, removed in the same step (None: never written, expired or taken)."""
        try:
            raw = await self.redis.getdel(self.key(response_id, tenant))
        except RedisError as exc:
            raise ResumeUnavailable(f"resumable state read failed: {exc}") from exc
        return raw.decode() if isinstance(raw, bytes) else raw

    def open(self, blob: str, response_id: str, tenant: str | None) -> ResponseState | None:
        """CPU only: the state a taken record holds, None when it does not open (another secret,
        tampered) or is not this response's record for this tenant."""
        try:
            text = self.sealer.open(blob)
        except ValueError:
            return None
        return decode(text, response_id, tenant)

    async def discard(self, response_id: str, tenant: str | None) -> bool:
        """Remove the record; True when it was still there (this caller claimed it)."""
        try:
            return bool(await self.redis.delete(self.key(response_id, tenant)))
        except RedisError as exc:
            raise ResumeUnavailable(f"resumable state delete failed: {exc}") from exc

    async def close(self) -> None:
        await self.redis.aclose()
