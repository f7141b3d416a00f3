"""Usage reports from the ledger: per tenant (key), model and UTC day.

Each of the ledger's stream shards is read with ``XRANGE`` in pages (``count`` entries, resuming
after the last id seen), so a report over months of records never asks Redis for one huge reply and
never blocks it for long; the shards are merged by entry id (the server's milliseconds), so records
come out in about the order they were written. The ledger is already deduplicated by response id
(see ``billing.ledger``: a record lives on one shard, chosen by its id), so every entry counts.
"""

from __future__ import annotations

import datetime as dt
import heapq
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from billing.ledger import DEFAULT_STREAM, shard_streams
from billing.usage import UsageRecord
from cache.redis_client import connect_sync


@dataclass(slots=True)
class UsageRow:
    tenant: str
    model: str
    day: str  # YYYY-MM-DD, UTC, of the response's creation
    responses: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


def iter_ledger(url: str, stream: str = DEFAULT_STREAM, *, shards: int = 1, page: int = 1000) -> Iterator[UsageRecord]:
    """Every record in the ledger's ``shards`` streams, oldest first, fetched ``page`` entries at a time."""
    client = connect_sync(url, decode_responses=True)
    try:
        pages = [_entries(client, name, page) for name in shard_streams(stream, shards)]
        for _key, fields in heapq.merge(*pages, key=lambda e: e[0]):
            yield UsageRecord.from_fields(fields)
    finally:
        client.close()


def _entries(client: Any, stream: str, page: int) -> Iterator[tuple[tuple[int, int], dict[str, str]]]:
    """One shard's entries as (id as numbers, fields), a page at a time."""
    start = "-"
    while True:
        entries = client.xrange(stream, min=start, max="+", count=page)
        for entry_id, fields in entries:
            ms, _, seq = entry_id.partition("-")
            yield (int(ms), int(seq or 0)), fields
        if len(entries) < page:
            return
        start = "(" + entries[-1][0]  # exclusive: resume after the last entry


def usage_report(url: str, stream: str = DEFAULT_STREAM, *, shards: int = 1, page: int = 1000) -> list[UsageRow]:
    """Aggregate the ledger (every shard) per (tenant, model, day); sorted by day, tenant, model."""
    rows: dict[tuple[str, str, str], UsageRow] = {}
    for r in iter_ledger(url, stream, shards=shards, page=page):
        day = dt.datetime.fromtimestamp(r.created_at, dt.UTC).strftime("%Y-%m-%d")
        key = (r.tenant or "-", r.model, day)
        row = rows.get(key)
        if row is None:
            row = rows[key] = UsageRow(tenant=key[0], model=key[1], day=day)
        row.responses += 1
        row.input_tokens += r.input_tokens
        row.cached_tokens += r.cached_tokens
        row.output_tokens += r.output_tokens
        row.reasoning_tokens += r.reasoning_tokens
    return sorted(rows.values(), key=lambda x: (x.day, x.tenant, x.model))


_COLUMNS = ("day", "tenant", "model", "responses", "input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")


def print_report(rows: list[UsageRow], out: TextIO, *, as_json: bool = False) -> None:
    """A fixed-width table (numbers right-aligned), or JSON: a list of row objects."""
    if as_json:
        out.write(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
        return
    cells = [list(_COLUMNS)] + [[str(getattr(r, c)) for c in _COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    for row in cells:
        out.write(
            "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip() + "\n"
        )
