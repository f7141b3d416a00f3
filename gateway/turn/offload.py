"""Prepare work off the event loop when a request is big, so one large request cannot stall the rest.

Why: validating, classifying and rendering a request is CPU work, linear in its size. The largest
request the caps allow (20,000 items, or a 10 MB string, or 512 tools) costs one to four seconds of
it; on the event loop that is one to four seconds in which no other connection is served — not
even ``/healthz``. In a worker thread the loop keeps its turn: CPython hands the GIL to a waiting
thread every switch interval (5 ms), and tiktoken releases it while it tokenizes.

Small requests — every agent continuation — stay inline: a hop to a thread and back costs more
than their whole preparation (figures in docs/operations.md, "Access: API keys and limits"). The
split is by the request's estimated size (:func:`weight`) against ``inline_prepare_bytes``.

Bounded: one pool of ``prepare_threads`` workers per gateway; more big requests queue for them,
so a flood of big requests costs queue entries, not threads. Only CPU pieces are handed over —
pure functions of request-local data and read-only shared data (renderers guard their caches with
locks, ``ItemLog`` reads are single dict and list operations, prometheus_client is thread-safe);
store reads, the connection cache and anything else asyncio stay with the caller on the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson

T = TypeVar("T")

#: what an input item or content part weighs beyond its text: per-item work (validating a model, a
#: classifier pass, a rendered message header) costs about as much as 128 bytes of text does
CONTAINER_WEIGHT = 128
#: the other fields (instructions, tools, schemas) count this many times less: they are the prompt's
#: prelude, rendered once and then cached by its key (``Renderer.render_prelude``) — a coding agent
#: re-sends ~40 KB of them with every continuation, which costs a key's hash, not a render
PRELUDE_DISCOUNT = 16
#: no body weighs more than this many times the length of the JSON text it was parsed from (see
#: :func:`weight_bound`)
TEXT_FACTOR = 69


def weight(body: Any, limit: int) -> int:
    """What preparing ``body`` will cost, in bytes of text: its ``input`` at its JSON size plus
    ``CONTAINER_WEIGHT`` per item and part, the other fields at their JSON size over
    ``PRELUDE_DISCOUNT``. Stops counting the input past ``limit`` (returns ``limit + 1``), so
    deciding costs microseconds for a continuation and no more than that for a 20,000-item body."""
    if not isinstance(body, dict):
        return 0
    rest = 0
    for key, value in body.items():
        if key == "input":
            continue
        if isinstance(value, str):
            rest += len(value)
        elif isinstance(value, (dict, list)):
            try:
                rest += len(orjson.dumps(value))  # C speed: ~10 us for a coding agent's tools
            except (orjson.JSONEncodeError, TypeError):
                return limit + 1  # nothing a JSON body holds; let the pool have it
    total = rest // PRELUDE_DISCOUNT
    return min(total + _input_weight(body.get("input"), limit - total), limit + 1)


def _input_weight(value: Any, limit: int) -> int:
    """``input``'s JSON size plus ``CONTAINER_WEIGHT`` per item (``input[i]``) and per part
    (``input[i].content[j]``), counted depth-first and lazily: O(min(size, limit))."""
    if isinstance(value, str) or limit < 0:
        return len(value) + 2 if isinstance(value, str) else limit + 1
    total = 0
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        node = next(stack[-1], _END)
        if node is _END:
            stack.pop()
            continue
        if isinstance(node, str):
            total += len(node) + 2
        elif isinstance(node, dict):
            # an item is visited two levels down (root, input list), a part four (+ item, content)
            total += 2 + sum(map(len, node)) + 3 * len(node) + (CONTAINER_WEIGHT if len(stack) in (2, 4) else 0)
            stack.append(iter(node.values()))
        elif isinstance(node, list):
            total += 2 + len(node)
            stack.append(iter(node))
        else:
            total += 5
        if total > limit:
            return limit + 1
    return total


_END = object()


def weight_bound(text_len: int) -> int:
    """An upper bound of :func:`weight` for a body parsed from a JSON text of ``text_len``
    characters (or bytes: a UTF-8 text has no fewer bytes than characters), so a small frame is
    sized without walking it.

    Why it holds — the input: every character of the text belongs to at most one value's own
    text (whitespace to none), and the walk charges each value at most a fixed multiple of its own
    characters: a string ``len + 2`` for at least its length plus two quotes (an escape only
    lengthens it); any other scalar 5 for at least one character (``0``); a list of ``n`` values
    ``2 + n`` for its ``n + 1`` brackets and commas (at most 2 a character); an object
    ``2 + Σ(len(key) + 3)`` for its braces and its keys, each quoted and followed by a colon (at
    most 1 a character). So the walk charges at most 5 a character, plus ``CONTAINER_WEIGHT`` (128)
    for each item and part, each an object with two braces of its own: at most 64 more a character,
    69 in all. The other fields: a string counts its length; an object or list the bytes of
    orjson's compact JSON of it, at most 4.5 a character of the text it was parsed from (UTF-8 is
    at most 4 bytes a character, and orjson escapes only what the text had to escape; the widest
    number is a float such as ``1e15``, written ``1000000000000000.0``: 18 for 4), which the
    16-fold prelude discount brings under 1 a character. ``tests/gateway/turn/test_prepare_cost_offload.py``
    checks the bound against the walk."""
    return TEXT_FACTOR * text_len


def written_bound(body: dict[str, Any]) -> int:
    """An upper bound of :func:`weight` from orjson's JSON of ``body`` and of its ``input`` (two
    calls in C): ``TEXT_FACTOR`` a byte of the input's (it is a text the input parses from, see
    :func:`weight_bound`) and the rest of the body's over ``PRELUDE_DISCOUNT`` (the other fields'
    strings and JSON are inside it, with their keys, quotes and commas besides). For a body whose
    own text was short enough to parse on the event loop, where writing it back costs about what
    parsing it did: a coding agent's continuation, ~10 KB of re-sent tools and a short input."""
    if not isinstance(body, dict):  # refused later as the create it is not; weighs nothing, as in weight()
        return 0
    try:
        whole = len(orjson.dumps(body))
        given = len(orjson.dumps(body.get("input")))
    except (orjson.JSONEncodeError, TypeError):
        return 1 << 62
    return (whole - given) // PRELUDE_DISCOUNT + TEXT_FACTOR * given


class Cpu:
    """How a stage runs its CPU piece: ``await cpu(fn, *args)`` — inline, or in the worker pool."""

    __slots__ = ("_pool", "inline")

    def __init__(self, pool: ThreadPoolExecutor | None) -> None:
        self._pool = pool
        #: whether it runs the work inline: a caller with one piece may then call it itself
        self.inline = pool is None

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._pool is None:
            return fn(*args, **kwargs)
        # the caller's context (log ids) goes with the work; a cancelled caller leaves the worker to
        # finish on its own (a thread cannot be interrupted) and its result is dropped
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)


#: run everything inline (a caller that did not size its request, and tests)
INLINE = Cpu(None)


class PrepareOffload:
    """The gateway's worker pool for big preparations, and the size that decides."""

    def __init__(self, inline_bytes: int, threads: int) -> None:
        self.inline_bytes = inline_bytes
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="respgate-prepare")
        self._offloaded = Cpu(self._pool)
        #: bodies prepared in the pool (tests and the note read it)
        self.offloaded = 0

    def for_size(self, nbytes: int) -> Cpu:
        """By a known size (an HTTP body's bytes)."""
        if nbytes <= self.inline_bytes:
            return INLINE
        self.offloaded += 1
        return self._offloaded

    @property
    def pool(self) -> Cpu:
        """The pool as a runner, not counted: for work that always belongs there (a page's text
        extraction, ``gateway.tools.web``), which is not a preparation."""
        return self._offloaded

    def pooled(self) -> Cpu:
        """The pool whatever the size: work known to be slow (a first import) stays off the loop."""
        self.offloaded += 1
        return self._offloaded

    def for_body(self, body: Any, text_bytes: int | None = None) -> Cpu:
        """By a parsed body's :func:`weight`. When the length of the text it was parsed from is
        known and within the limit (``TurnContext.body_bytes``: a WebSocket continuation's frame),
        inline without the walk if a bound of its weight is within the limit too:
        :func:`weight_bound` of the text's length, else :func:`written_bound`."""
        limit = self.inline_bytes
        if (
            text_bytes is not None
            and text_bytes <= limit
            and (weight_bound(text_bytes) <= limit or written_bound(body) <= limit)
        ):
            return INLINE
        return self.for_size(weight(body, limit))

    def close(self) -> None:
        """Shutdown: queued work is dropped, running work finishes in its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
