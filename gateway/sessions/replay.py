"""A background stream resumed after sequence number ``N``: the events a transport frames.

``GET /v1/responses/{id}?stream=true&starting_after=N`` (and a background create with
``stream: true``, which reads its own log from the start) gets the events after ``N`` that the
response's event log still holds, then each live one, to a terminal event. The log kept on this
replica is followed when there is one (the owner's own readers); else the Redis copy, on any
replica. What to answer is the machine's :func:`~gateway.sessions.background_machine.plan_replay`
(400s before anything is sent: not a background response, no events kept, or ``N`` older than
the window); this module does the reading.

A stream always ends with a terminal event: a gap (a reader slower than the window) or an outage
while following ends it with an ``error`` event; a log that stopped short of its terminal (its
owner died, or it was dropped) ends with the stored response's terminal. A reader that started
after the terminal gets nothing.

The events are :class:`~cache.event_log.LoggedEvent`: each one's type and JSON, encoded once when
the turn made it. Framing is the transport's (``gateway.transport.sse`` for HTTP); nothing here
knows SSE.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from redis.exceptions import RedisError

from cache.event_log import EventLog, LoggedEvent, LogUnavailable, MemoryEventLogs, Truncated
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoreUnavailable
from gateway.base.settings import Settings
from gateway.sessions.background_machine import Replay, Window, plan_replay
from gateway.sessions.background_turn import ACTIVE, logged
from gateway.sessions.replicas import Replicas
from gateway.turn.events import late_terminal
from gateway.wire.errors import ApiError, bad_request, store_unavailable


class Replayer:
    """Opens resumed streams over this replica's logs and, with Redis, the shared ones."""

    def __init__(
        self, settings: Settings, store: ResponseStore, logs: MemoryEventLogs, replicas: Replicas | None
    ) -> None:
        self.settings = settings
        self.store = store
        self.logs = logs
        self.replicas = replicas

    async def open(self, state: ResponseState, tenant: str | None, after: int) -> AsyncGenerator[LoggedEvent, None]:
        """The events after ``after`` (-1: all), then the live ones; raises the 400s first."""
        rid = state.id
        background = bool(state.response.get("background"))
        local = self.logs.get(rid) if background else None
        if local is not None:
            plan = plan_replay(after, background=True, window=_window(local), expected=True)
            self._refuse(plan, rid, local.first_seq)
            if plan is Replay.NOTHING:
                return _empty()
            return self._events(rid, tenant, local.follow(after), after, lambda: _done(local.terminal_seq is not None))
        replicas = self.replicas
        window: Window | None = None
        expected = False
        if background and replicas is not None:
            try:
                bounds = await replicas.log.bounds(rid)
                info = await replicas.leases.info(rid) if bounds is None else None
            except RedisError:
                raise store_unavailable() from None
            window = Window(*bounds) if bounds is not None else None
            expected = info is not None and bool(info.get("stream"))
        plan = plan_replay(after, background=background, window=window, expected=expected)
        self._refuse(plan, rid, window.first if window is not None else 0)
        if plan is Replay.NOTHING:
            return _empty()
        assert replicas is not None
        shared = replicas.log

        async def logged_terminal() -> bool:
            got = await shared.bounds(rid)
            return got is not None and got[2]

        return self._events(
            rid, tenant, shared.follow(rid, after, lambda: replicas.over(rid, tenant)), after, logged_terminal
        )

    def _refuse(self, plan: Replay, rid: str, first_kept: int) -> None:
        if plan is Replay.NOT_BACKGROUND:
            raise bad_request(
                "Streaming retrieval is only available for background responses.",
                code="unsupported_parameter",
                param="stream",
            )
        if plan is Replay.NO_EVENTS:
            raise _no_events(rid, self.settings.background_events_ttl_s)
        if plan is Replay.TRUNCATED:
            raise _truncated(rid, first_kept)

    async def _events(
        self,
        rid: str,
        tenant: str | None,
        source: AsyncIterator[LoggedEvent],
        after: int,
        has_terminal: Callable[[], Awaitable[bool]],
    ) -> AsyncGenerator[LoggedEvent, None]:
        """A log's events as one stream that always ends with a terminal event (module docstring)."""
        last, ended = after, False
        try:
            async for entry in source:
                last += 1
                ended = entry.terminal
                yield entry
        except Truncated as exc:
            yield logged(_truncated(rid, exc.first_kept).sse_event(last + 1))
            return
        except LogUnavailable:
            yield logged(store_unavailable().sse_event(last + 1))
            return
        if not ended:
            try:
                state = None if await has_terminal() else await self.store.get(rid, tenant)
            except (StoreUnavailable, RedisError):
                state = None
            if state is not None and state.status not in ACTIVE:
                yield logged(late_terminal(state.response, last + 1))


def _window(log_: EventLog) -> Window:
    return Window(log_.first_seq, log_.next_seq - 1, log_.terminal_seq is not None)


async def _done(value: bool) -> bool:
    return value


async def _empty() -> AsyncGenerator[LoggedEvent, None]:
    return
    yield  # an async generator that yields nothing


def _no_events(rid: str, ttl_s: float) -> ApiError:
    return bad_request(
        f"No event stream is kept for response '{rid}': only background responses created with "
        f"stream=true keep their events, for {ttl_s:g} s after the last one. Retrieve it without "
        "stream=true.",
        code="invalid_value",
        param="stream",
    )


def _truncated(rid: str, first_kept: int) -> ApiError:
    return bad_request(
        f"The events of response '{rid}' before sequence number {first_kept} are no longer kept; "
        f"resume from starting_after={first_kept - 1} or later, or retrieve it without stream=true.",
        code="invalid_value",
        param="starting_after",
    )
