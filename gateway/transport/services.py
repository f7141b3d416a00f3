"""What the app holds for its lifetime: settings, engines, stores, the pipeline, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from billing.usage import UsageQueue
from cache.response_store import ResponseStore
from gateway.access.auth import KeyAuth
from gateway.access.rate_limits import Access
from gateway.base.metrics import Metrics
from gateway.turn.pipeline import Pipeline
from gateway.base.settings import Settings
from inference.registry import ModelRegistry


@dataclass
class GatewayState:
    settings: Settings
    registry: ModelRegistry
    store: ResponseStore
    usage: UsageQueue
    metrics: Metrics
    pipeline: Pipeline
    auth: KeyAuth
    #: per-key rate limits and connection counts
    access: Access
    started_at: int = field(default_factory=lambda: int(time.time()))
    accepting: bool = False
    #: open WebSocket connections (``gateway.transport.ws.WsConnection``: drained at shutdown)
    connections: set[Any] = field(default_factory=set)
    #: HTTP turns running (``gateway.transport.inflight.HttpTurn``: drained, then cut, at shutdown)
    http_turns: set[Any] = field(default_factory=set)
    #: background responses (``gateway.sessions.background.BackgroundTurns``; set by the app factory)
    background: Any = None
    #: closed connections' resumable lane states (``gateway.sessions.resumable``); None: off
    resumable: Any = None
