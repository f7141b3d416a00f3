"""The billing ledger: a Redis Stream of usage records, idempotent by response id.

Why a script: a batch may be written twice — the worker timed out waiting for a reply that Redis
did send, so the batch went to the journal too; or a journal segment is replayed again after a
crash mid-replay. Each record is therefore guarded by a per-response marker key. One Lua script
does ``SET marker NX EX ttl`` and ``XADD`` only when the marker was new, for the whole batch,
atomically: no reader ever sees a record without its marker or the other way round, and a replay
of anything already in the stream is a no-op.

The marker TTL bounds how late a duplicate can arrive and still be recognised. Duplicates come
only from journal replays, which run as soon as Redis answers again, so days are plenty; it is a
constructor argument for operators with longer outages.

Redis Cluster: the script touches the stream and one marker per record, and Cluster runs a script
only when all its keys hash to one slot. Markers therefore carry the stream's name as their hash
tag — ``{respgate:usage}:seen:<id>`` hashes exactly like the stream key ``respgate:usage`` — so a
batch is always single-slot (and all usage lands on one shard: a stream is one key anyway). A
stream name that has its own tag (``{usage}:stream``) lends that tag to its markers instead. (Before
this naming, markers were ``<stream>:seen:<id>``: a replay across the upgrade of a record written
under the old name would be counted again; the stream itself is unchanged.) The client comes from
``cache.redis_client``: a ``redis+cluster://`` URL gets the cluster client.

Failures are fast on purpose (short socket timeouts, no client-side retries): a failed batch goes
to the journal at once instead of holding the queue, and the replay loop is the retry.
"""

from __future__ import annotations

from typing import Sequence

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from billing.usage import UsageRecord
from cache.redis_client import connect

DEFAULT_STREAM = "respgate:usage"
DEFAULT_MARKER_TTL_S = 7 * 24 * 3600

#: KEYS[1] = stream, KEYS[2..] = one marker per record; ARGV[1] = ttl, ARGV[2] = fields per record,
#: then field/value pairs, record after record. Returns how many records were new.
_APPEND_ONCE = """
local ttl = ARGV[1]
local nf = tonumber(ARGV[2]) * 2
local added = 0
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    local base = 2 + (i - 2) * nf
    local fields = {}
    for j = 1, nf do fields[j] = ARGV[base + j] end
    redis.call('XADD', KEYS[1], '*', unpack(fields))
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


class RedisLedger:
    """Usage sink writing batches to a Redis Stream; replaying a batch never double-counts."""

    durable = True
    #: records per script call: one call blocks Redis for its duration, so keep it short
    max_batch = 256

    def __init__(self, url: str, stream: str = DEFAULT_STREAM, *, marker_ttl_s: int = DEFAULT_MARKER_TTL_S,
                 timeout_s: float = 2.0) -> None:
        slot_tag(stream)  # refuse a name whose markers could not share its cluster slot
        self.stream = stream
        self.marker_ttl_s = marker_ttl_s
        self.redis = connect(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                    retry=Retry(NoBackoff(), 0), decode_responses=True)
        self._script = self.redis.register_script(_APPEND_ONCE)
        #: records the ledger actually appended (replays of known records are not counted)
        self.appended = 0

    async def write_batch(self, records: Sequence[UsageRecord]) -> None:
        for start in range(0, len(records), self.max_batch):
            chunk = records[start:start + self.max_batch]
            keys = [self.stream, *(marker_key(self.stream, r.response_id) for r in chunk)]
            args: list[str | int] = [self.marker_ttl_s, len(UsageRecord.FIELDS)]
            for r in chunk:
                for name, value in r.to_fields().items():
                    args += [name, value]
            self.appended += int(await self._script(keys=keys, args=args))

    async def close(self) -> None:
        await self.redis.aclose()
