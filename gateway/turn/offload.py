"""Prepare work off the event loop when a request is big, so one large request cannot stall the rest.

Why: validating, classifying and rendering a request is CPU work, linear in its size. The largest
request the caps allow (20,000 items, or a 10 MB string, or 512 tools) costs one to four seconds of
it; on the event loop that is one to four seconds in which no other connection is served — not
even ``/healthz``. In a worker thread the loop keeps its turn: CPython hands the GIL to a waiting
thread every switch interval (5 ms), and tiktoken releases it while it tokenizes.

Small requests — every agent continuation — stay inline: a hop to a thread and back costs more
than their whole preparation (figures in README, "API keys and limits"). The split is by the request's
estimated size (:func:`weight`) against ``inline_prepare_bytes``.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, TypeVar

import orjson

T = TypeVar("T")

#: what an input item or content part weighs beyond its text: per-item work (validating a model, a
#: classifier pass, a rendered message header) costs about as much as 128 bytes of text does
CONTAINER_WEIGHT = 128
#: the other fields (instructions, tools, schemas) count this many times less: they are the prompt's
#: prelude, rendered once and then cached by its key (``Renderer.render_prelude``) — a coding agent
#: re-sends ~40 KB of them with every continuation, which costs a key's hash, not a render
PRELUDE_DISCOUNT = 16


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


class Cpu:
    """How a stage runs its CPU piece: ``await cpu(fn, *args)`` — inline, or in the worker pool."""

    __slots__ = ("_pool",)

    def __init__(self, pool: ThreadPoolExecutor | None) -> None:
        self._pool = pool

    @property
    def inline(self) -> bool:
        return self._pool is None

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

    def pooled(self) -> Cpu:
        """The pool whatever the size: work known to be slow (a first import) stays off the loop."""
        self.offloaded += 1
        return self._offloaded

    def for_body(self, body: Any) -> Cpu:
        """By a parsed body's :func:`weight`."""
        return self.for_size(weight(body, self.inline_bytes))

    def close(self) -> None:
        """Shutdown: queued work is dropped, running work finishes in its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
