"""The billing ledger: Redis Streams of usage records, idempotent by response id.

Why a script: a batch may be written twice — the worker timed out waiting for a reply that Redis
did send, so the batch went to the journal too; or a journal segment is replayed again after a
crash mid-replay. Each record is therefore guarded by a per-response marker key. One Lua script
does ``SET marker NX EX ttl`` and ``XADD`` only when the marker was new, for the whole batch,
atomically: no reader ever sees a record without its marker or the other way round, and a replay
of anything already in the stream is a no-op.

**The marker TTL** (``usage_marker_ttl_s``, default one day) bounds how late a duplicate can
arrive and still be recognised: a record's first write sets its marker, and a replay of it must
come before the marker expires. Duplicates come only from journal replays, and those run as soon as
Redis answers again (the replay loop retries every few seconds) or when a replica restarts with its
journal; so the TTL must outlast the longest outage (or the longest a replica with a journal stays
down) that billing must stay exact across. A day covers an outage that is noticed and fixed the
same day; the markers cost memory in proportion (``deploy/SCALING.md``: 120 B each, a week of them
at 10,000 records/s is 678 GiB, a day 97 GiB), so it is a setting for operators who need longer.

**Shards** (``usage_stream_shards``). One stream is one key, so one Redis Cluster shard would take
all billing, and its markers with it. The ledger is therefore N streams: shard 0 is the stream
named by ``usage_stream`` (``respgate:usage``), shard *i* ≥ 1 is ``respgate:usage:i`` (a name with
its own tag, ``{usage}:s``, becomes ``{usage:i}:s``): each its own hash tag, so shards spread over
the cluster's nodes. A record's shard is a stable hash (CRC-32) of its **response id**, not of its
tenant: the response id is what idempotency is keyed by, so a replayed record meets its own marker
on every write, from every replica, after every restart; and ids are random, so shards fill
evenly, where one big tenant (a company behind one key) would make its shard the hot one again. A
batch is split per shard and each shard's part is one script (single-slot, Redis Cluster safe; no
``MULTI``, see ``cache.redis_client``). Readers (``billing.report``, ``respgate usage``) read every
shard.

The default is **one shard**: today's layout exactly (the stream and its markers keep their names),
so an upgrade changes nothing. A record's shard depends on the count, so change the count only
when no replica's journal holds records (a replica that stops cleanly drains its queue; check that
``respgate_billing_journal_bytes`` is 0): a record journaled under one count and replayed under
another may land on a shard that has no marker for it and be counted twice. Growing the count keeps
every stream that exists (shard 0 is the old stream); lowering it leaves the higher shards' records
unread by the reports (``respgate usage --shards N`` still reads them).

**Retention** (``usage_stream_retention_s``, off by default). The streams are append-only: at
10,000 records/s they grow about 105 GiB a day. With a retention set, each script's ``XADD`` trims
its shard with ``MINID ~`` to the records of the last that many seconds (by the server's clock:
stream ids are its milliseconds), in the same atomic step; ``~`` lets Redis drop whole stream nodes
only, so a trim costs about nothing. Off by default because billing must have read a record before
it goes: set it above your billing export's interval. Trimming never touches markers, so a replay
of a trimmed record is still recognised while its marker lives.

Redis Cluster: the script touches one stream and one marker per record, and Cluster runs a script
only when all its keys hash to one slot. Markers therefore carry their stream's name as their hash
tag — ``{respgate:usage}:seen:<id>`` hashes exactly like the stream key ``respgate:usage`` — so a
shard's batch is always single-slot. A stream name that has its own tag (``{usage}:stream``) lends
that tag to its markers instead. (Before this naming, markers were ``<stream>:seen:<id>``: a replay
across the upgrade of a record written under the old name would be counted again; the stream
itself is unchanged.) The client comes from ``cache.redis_client``: a ``redis+cluster://`` URL gets
the cluster client.

Failures are fast on purpose (short socket timeouts, no client-side retries): a failed batch goes
to the journal at once instead of holding the queue, and the replay loop is the retry. A batch
whose shards partly succeeded raises too: the replay rewrites the shards that took it as no-ops.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from billing.usage import UsageRecord
from cache.redis_client import connect

DEFAULT_STREAM = "respgate:usage"
#: see the module docstring: replays run as soon as Redis answers again; a day covers a long outage
DEFAULT_MARKER_TTL_S = 24 * 3600

#: KEYS[1] = stream, KEYS[2..] = one marker per record; ARGV[1] = ttl, ARGV[2] = fields per record,
#: ARGV[3] = retention in ms (0: none), then field/value pairs, record after record. Returns how
#: many records were new. ``TIME`` before the writes is fine: scripts replicate their effects.
_APPEND_ONCE = """
local ttl = ARGV[1]
local nf = tonumber(ARGV[2]) * 2
local keep_ms = tonumber(ARGV[3])
local trim = nil
if keep_ms > 0 then
  local now = redis.call('TIME')
  trim = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - keep_ms)
end
local added = 0
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    local base = 3 + (i - 2) * nf
    local fields = {}
    for j = 1, nf do fields[j] = ARGV[base + j] end
    if trim then
      redis.call('XADD', KEYS[1], 'MINID', '~', trim, '*', unpack(fields))
    else
      redis.call('XADD', KEYS[1], '*', unpack(fields))
    end
    added = added + 1
  end
end
return added
"""


def marker_key(stream: str, response_id: str) -> str:
    """The dedup marker of one record: same cluster slot as ``stream`` (see the module docstring)."""
    return f"{slot_tag(stream)}:seen:{response_id}"


def slot_tag(key: str) -> str:
    """A prefix whose hash tag hashes like ``key``: ``key`` itself if it has a tag, else ``{key}``."""
    start = key.find("{")
    end = key.find("}", start + 1) if start != -1 else -1
    if start != -1 and end > start + 1:
        return key  # its tag is the first {...}: keys that start with it share it
    if "{" in key or "}" in key:
        raise ValueError(f"usage stream name {key!r}: braces must form a non-empty hash tag like {{name}}")
    return "{" + key + "}"


def shard_stream(stream: str, index: int) -> str:
    """Shard ``index``'s stream: ``stream`` itself for shard 0 (today's key), else a name with a
    hash tag of its own — ``stream:i``, or ``{tag:i}rest`` for a name that has a tag."""
    slot_tag(stream)  # refuse a malformed name
    if index == 0:
        return stream
    start = stream.find("{")
    if start == -1:
        return f"{stream}:{index}"
    end = stream.find("}", start + 1)
    return f"{stream[:end]}:{index}{stream[end:]}"


def shard_streams(stream: str, shards: int) -> list[str]:
    """Every shard's stream, shard 0 first."""
    if shards < 1:
        raise ValueError(f"usage stream shards must be at least 1, not {shards}")
    return [shard_stream(stream, i) for i in range(shards)]


def shard_of(response_id: str, shards: int) -> int:
    """The shard of a record: a hash of its response id that every process computes alike (CRC-32:
    Python's ``hash`` of a string differs per process)."""
    return zlib.crc32(response_id.encode()) % shards if shards > 1 else 0


class RedisLedger:
    """Usage sink writing batches to the ledger's stream shards; replaying a batch never double-counts."""

    durable = True
    #: records per script call: one call blocks its shard for its duration, so keep it short
    max_batch = 256

    def __init__(
        self,
        url: str,
        stream: str = DEFAULT_STREAM,
        *,
        shards: int = 1,
        marker_ttl_s: int = DEFAULT_MARKER_TTL_S,
        retention_s: float | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.stream = stream
        #: shard i's stream (refuses a name whose markers could not share its cluster slot)
        self.streams = shard_streams(stream, shards)
        if marker_ttl_s < 1:
            raise ValueError(f"usage marker TTL must be at least 1 s, not {marker_ttl_s}")
        self.marker_ttl_s = int(marker_ttl_s)
        #: trim each shard to this many seconds of records (None: never trim)
        self.retention_ms = int(retention_s * 1000) if retention_s else 0
        self.redis = connect(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._script = self.redis.register_script(_APPEND_ONCE)
        #: records the ledger actually appended (replays of known records are not counted)
        self.appended = 0

    @property
    def shards(self) -> int:
        return len(self.streams)

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        parts: dict[int, list[UsageRecord]] = {}
        for r in records:
            parts.setdefault(shard_of(r.response_id, len(self.streams)), []).append(r)
        calls = [
            self._append(self.streams[shard], part[start : start + self.max_batch])
            for shard, part in parts.items()
            for start in range(0, len(part), self.max_batch)
        ]
        if len(calls) == 1:
            await calls[0]
            return
        # the shards' scripts run concurrently (different nodes on a cluster); all of them end
        # before this returns or raises, so a failure is journaled only once the others are done
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _append(self, stream: str, chunk: Sequence[UsageRecord]) -> None:
        keys = [stream, *(marker_key(stream, r.response_id) for r in chunk)]
        args: list[str | int] = [self.marker_ttl_s, len(UsageRecord.FIELDS), self.retention_ms]
        for r in chunk:
            for name, value in r.to_fields().items():
                args += [name, value]
        added = int(await self._script(keys=keys, args=args))  # awaited first: calls run concurrently
        self.appended += added

    async def close(self) -> None:
        await self.redis.aclose()
