"""One turn's values as they pass from stage to stage: who asks, what the turn adds, what was rendered.

Each stage returns a frozen value and no module mutates another's: ``resolve`` gives a
:class:`TurnInput`, ``render`` a :class:`Rendered`, and ``prepare`` bundles them into a
:class:`PreparedTurn`. The only mutable part is the Response object itself, which the turn's event
builder owns while it runs.

The values are ``msgspec.Struct(frozen=True)`` records, not frozen dataclasses: the same
immutability, equality and hashing, but built in C. A frozen dataclass sets each field through
``object.__setattr__`` in generated Python (~0.16 us a field, 6x a plain slot store); a short
WebSocket turn builds ~20 such records (these, the lanes machine's events and actions, the
engine's deltas and sampling parameters, the parser's events, the response state) with ~200
fields, which was ~7% of its Python bytecodes. A Struct is ~20x cheaper to build. Change one
with ``msgspec.structs.replace`` (``dataclasses.replace`` does not know it).

A prepared turn holds the rendered *delta* (``Rendered.new_ids``) next to the parent's token view
(``Rendered.base_ids``) instead of an already-extended sequence: the shared append-only buffer is
only touched when the turn actually runs, so a request that is rejected (or only counted, as by
``/responses/input_tokens``) never leaves the parent's buffer past its tip — which would make the
parent's next continuation copy the whole history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from cache.connection_state import ConnectionCache
from cache.conversations import ConversationRef
from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.seq import TokenSeq
from gateway.base.metrics import StageTimer
from gateway.base.tracing import current_traceparent
from gateway.tools.hosted import NO_HOSTED, HostedTurn
from gateway.wire.dialects import EventDialect
from gateway.wire.request import CreateRequest
from inference.engine import RequestRouting, SamplingParams
from inference.registry import ModelRoute
from inference.renderer import Prelude
from security.classifiers import Verdict

Transport = Literal["http", "ws"]
Item = dict[str, Any]
#: called once with a finished turn's usage object (the rate limiter's token reconciliation)
UsageHook = Callable[[Mapping[str, Any]], None]


class SteerSignal:
    """A WebSocket connection's ``response.steer`` reaching the turn it targets.

    The transport sets ``requested`` (``gateway.transport.steering``); the turn reads it at each
    engine delta and after each round of gateway-run tools (``gateway.turn.run``): set, the turn
    stops at the next safe boundary — the next token, unless the pass has begun a tool call, which
    ends the pass by itself — and ends ``incomplete`` (``steered``), its history cut there as a
    capped turn's is, so the successor appends the steer's tokens at the tip. A plain flag, not an
    ``asyncio.Event``: nothing waits on it, and the hot loop pays one attribute read per delta."""

    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False


class TurnContext(msgspec.Struct, frozen=True):
    """Who is asking and where the answer goes; transports fill it in."""

    transport: Transport
    tenant: str | None = None
    #: the WebSocket connection's cache (continuations resolve against it first); None over HTTP
    conn_cache: ConnectionCache | None = None
    lane: str = ""
    #: length of the JSON text the body was parsed from (a frame's characters, a request's bytes),
    #: when the transport had it: bounds the prepare work without a walk (``gateway.turn.offload``)
    body_bytes: int | None = None
    #: the dialect the client asked its events in (``gateway.wire.dialects``: a header on the create
    #: or the WebSocket upgrade); None: the operator's setting for the model decides
    dialect: EventDialect | None = None
    #: set by a WebSocket connection for a turn that may be steered (None: it may not)
    steer: SteerSignal | None = None


class PrefixMatch(msgspec.Struct, frozen=True):
    """What the prefix cache made of a request that names no parent (``gateway.turn.prefix``).

    ``ids`` + ``lead`` are the tokens of the prelude and of ``new_items[:covered]``, token-exact
    with a full render; None when no prefix was cached (the turn renders in full). The first
    ``seen`` items entered the tenant's conversation in an earlier turn (classified then, or the
    model's own output) and are not classified again."""

    #: the digest of the prelude and all of the request's items: the turn's own entry, once it ran
    digest: bytes
    ids: TokenSeq | None = None
    covered: int = 0
    seen: int = 0
    #: tokens the lookup already rendered for the last items of ``covered`` (``ids`` ends before them)
    lead: tuple[int, ...] = ()
    #: an item of the cached prefix was flagged (as ``ResponseState.flagged`` is inherited)
    flagged: bool = False
    #: the cache's chain the hit came from (the turn's own entry joins it)
    chain: Any = None
    #: the root response of the conversation the hit continues (None: a miss)
    root_id: str | None = None


class TurnInput(msgspec.Struct, frozen=True):
    """What ``resolve`` makes of a create: the checked request, its model, and the delta to the parent."""

    req: CreateRequest
    route: ModelRoute
    #: tool definitions as echoed in the Response (hosted tools stripped)
    tools: tuple[dict[str, Any], ...]
    prelude: Prelude
    #: the response continued from (None: a new conversation, or a compaction item replaced it)
    parent: ResponseState | None
    #: the parent's items (what the new items are appended to)
    base_context: ItemLog
    new_items: tuple[Item, ...]
    #: the request's items as ``input_items`` lists them: ``new_items``, after what an implied
    #: parent's context the client re-sent (``gateway.turn.resolve``)
    input_items: tuple[Item, ...]
    #: call_id -> call item, of the calls among the new items
    new_calls: Mapping[str, Item]
    #: tool calls still unanswered after the new items
    pending_calls: frozenset[str]
    #: a ``compaction_trigger`` input item asked for compaction before generating
    compact_trigger: bool
    generate: bool
    store: bool
    #: the conversation the turn reads and extends (``gateway.turn.conversation``)
    conversation: ConversationRef | None = None
    #: a request with no parent: its longest prefix already rendered for the tenant (or a miss)
    prefix: PrefixMatch | None = None
    #: the prefix-cache digest of the turn's whole input as a full-history client would send it
    #: (``gateway.turn.prefix``): a parentless request's, or a chained turn's folded from its
    #: parent's at resolve; None when the turn cannot leave a prefix-cache entry, or when it is
    #: folded later (``digest_later``)
    digest: bytes | None = None
    #: a chained turn prepared inline: its digest is folded when its state is built
    #: (``Finalizer``: ``PrefixReuse.extend``) — after its terminal event, or before it for a
    #: ``store=true`` turn, whose state is written first — not on the path to its first token
    digest_later: bool = False
    #: the turn's MCP servers, the model's view of their tools, the calls approved to run
    #: (``gateway.tools.hosted``); ``NO_HOSTED`` when the request names none
    hosted: HostedTurn = NO_HOSTED

    @property
    def root_id(self) -> str | None:
        """The root of the chain the turn continues (None: it starts one). A conversation is one
        chain whatever this process remembers of it; a compaction item starts a new one."""
        if self.conversation is not None:
            return self.conversation.id
        if self.parent is not None:
            return self.parent.root
        return self.prefix.root_id if self.prefix is not None else None

    @property
    def flagged_before(self) -> bool:
        """An item the turn continues from was flagged: the parent's chain, or the cached prefix."""
        if self.parent is not None:
            return self.parent.flagged
        return self.prefix is not None and self.prefix.flagged


class RenderStats(msgspec.Struct, frozen=True):
    mode: Literal["append", "full"]
    new_tokens: int
    fallback_reason: str | None = None
    truncated_items: int = 0


class Rendered(msgspec.Struct, frozen=True):
    """The prompt as token ids: the parent's view (an append) or None (a full render), plus the delta."""

    prelude_key: bytes
    #: the parent's rendered history when appending; None for a full render
    base_ids: TokenSeq | None
    #: tokens rendered for this turn (the new items; or prelude + whole context on a full render)
    new_ids: list[int]
    #: the generation prompt (empty for a ``generate: false`` warm-up)
    gen_ids: list[int]
    stats: RenderStats

    @property
    def prompt_len(self) -> int:
        base = len(self.base_ids) if self.base_ids is not None else 0
        return base + len(self.new_ids) + len(self.gen_ids)


class PreparedTurn(msgspec.Struct, frozen=True):
    """A create that passed every check: the response exists (``in_progress``) and may run."""

    input: TurnInput
    ctx: TurnContext
    rendered: Rendered
    #: None for a ``generate: false`` warm-up
    sampling: SamplingParams | None
    #: the Response object; the turn's event builder mutates it while the turn runs
    response: dict[str, Any]
    #: this turn's non-allow classifier verdicts
    verdicts: tuple[Verdict, ...]
    #: this turn or an ancestor was flagged
    flagged: bool
    include_encrypted: bool
    #: perf_counter when the request arrived
    started: float
    #: wall clock at arrival (billing: created_at)
    created_at: float
    #: the turn's stage clock, lapped on by the run and finalize (Server-Timing, traces)
    clock: StageTimer
    #: the JSON of ``response["tools"]``, built once per tool set (``gateway.wire.response.EchoedTools``):
    #: what the transports write for it (``gateway.turn.events.wire_event``); None without tools
    tools_json: Any = None

    @property
    def id(self) -> str:
        rid: str = self.response["id"]
        return rid

    @property
    def req(self) -> CreateRequest:
        return self.input.req

    @property
    def route(self) -> ModelRoute:
        return self.input.route

    @property
    def prompt_len(self) -> int:
        return self.rendered.prompt_len

    @property
    def root_id(self) -> str:
        """The root of the turn's chain: its parent's root, or the turn itself."""
        return self.input.root_id or self.id

    def routing(self) -> RequestRouting:
        """How the turn's engine requests are routed (a router keeps the chain on one pod), with the
        trace context of the turn's current span when tracing is on (``traceparent`` to vLLM)."""
        return RequestRouting.for_chain(self.ctx.tenant, self.root_id, current_traceparent())
