"""What the app holds for its lifetime: settings, engines, stores, the pipeline, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from billing.usage import UsageQueue
from cache.response_store import ResponseStore
from gateway.access.auth import KeyAuth
from gateway.access.rate_limits import Access
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.containers.registry import ContainerRegistry
from gateway.files.files import Files
from gateway.files.vector_stores import VectorStores
from gateway.turn.pipeline import Pipeline
from inference.registry import ModelRegistry

if TYPE_CHECKING:  # each of these imports this module: named for the checker only
    from gateway.sessions.background import BackgroundTurns
    from gateway.sessions.resumable import ResumableStates
    from gateway.transport.inflight import HttpTurn
    from gateway.transport.ws import WsConnection


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
    #: background responses (built by the app factory before this state)
    background: BackgroundTurns
    #: uploaded files (``/v1/files``; ``gateway.files``)
    files: Files
    #: vector stores (``/v1/vector_stores``; what ``file_search`` searches)
    vector_stores: VectorStores
    started_at: int = field(default_factory=lambda: int(time.time()))
    accepting: bool = False
    #: open WebSocket connections (drained at shutdown)
    connections: set[WsConnection] = field(default_factory=set)
    #: HTTP turns running (drained, then cut, at shutdown)
    http_turns: set[HttpTurn] = field(default_factory=set)
    #: closed connections' resumable lane states (``gateway.sessions.resumable``); None: off
    resumable: ResumableStates | None = None
    #: this replica's containers (``/v1/containers`` and ``code_interpreter``; ``gateway.containers``);
    #: None where ``code_interpreter`` is ``off``
    containers: ContainerRegistry | None = None
