"""Resolve: a create body -> :class:`TurnInput` (the checked request, its parent, the new items).

    parse + checks  ->  parent (connection cache -> shared store -> 400)  ->  new items against it

Only the new items are validated: an ``item_reference`` or a tool output is looked up in the
parent's item log (O(1) by id or call id), never by scanning the history. A reference the parent
does not hold resolves against the tenant's stored responses (``store=true``; one index lookup per
id, ``ResponseStore.items``). A ``compaction`` input item replaces everything before it
(``gateway.turn.compaction``), the parent included.

**Implied parent.** A client that keeps the conversation itself but lets the server store it (the
AI SDK's default) re-sends the whole conversation each step, with the earlier output items as
references and no ``previous_response_id``. When the input begins with exactly the context of the
stored response that holds its last reference (references by id, other items equal but for their
ids), that response is the turn's parent: only the rest is new, so the turn is classified and
rendered as a continuation (an append onto the parent's tokens when this process has them).

**Conversations.** A ``conversation`` create's parent is what ``gateway.turn.conversation`` makes
of the conversation: this process's last response on it when the conversation is unchanged since
(an append), else a stand-in holding its stored items (a full render).

**No parent at all.** A request that names none, implies none and is on no conversation (Codex's
HTTP transport, the AI SDK with ``store: false``) is looked up in the tenant's prefix cache
(``gateway.turn.prefix``): the longest prefix an earlier turn rendered is not rendered or
classified again.

**Where the work runs.** Parsing, item building and the implied-parent comparison are CPU work that
a big request hands to the prepare pool (``gateway.turn.offload``); store and connection-cache
lookups stay on the event loop between them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import msgspec
import orjson

from cache.item_log import ItemLog
from cache.response_state import ResponseState
from cache.response_store import ResponseStore, StoredItem, StoreUnavailable, call_key
from gateway.base.metrics import Metrics
from gateway.containers.model import Containers
from gateway.files.vector_stores import VectorStores
from gateway.tools.code_interpreter import calls_used, check_code_tool
from gateway.tools.file_search import check_file_tool, file_search_namespace
from gateway.tools.hosted import NO_HOSTED, HostedTools, HostedTurn, approvals_to_run
from gateway.tools.web import WebSearch
from gateway.turn.checks import (
    CODE_OFF,
    CheckedItem,
    CheckedTools,
    HostedToolPolicy,
    ItemChecks,
    ToolChecks,
    check_supported,
    check_tool_choice,
    hosted_choice,
    prelude_of,
    route_of,
)
from gateway.turn.compaction import Compactor
from gateway.turn.conversation import Conversations
from gateway.turn.offload import INLINE, Cpu, PrepareOffload
from gateway.turn.prefix import PrefixReuse, item_digest
from gateway.turn.sealing import Sealer, SealError
from gateway.turn.types import Item, Transport, TurnContext, TurnInput
from gateway.wire.errors import ApiError, bad_request, previous_response_not_found, store_unavailable
from gateway.wire.items import (
    Compaction,
    CustomToolCall,
    FunctionCall,
    HostedItem,
    ItemReference,
    Message,
    Reasoning,
    canonical_item,
    new_id,
)
from gateway.wire.kinds import CALL_TYPES, CHAINABLE, OUTPUT_TYPES, ItemType
from gateway.wire.request import CreateRequest, parse_create
from gateway.wire.tools import GATEWAY_RUN_TYPES, McpTool
from inference.browser_tool import BROWSER
from inference.hosted_items import call_of
from inference.python_tool import PYTHON, python_namespace
from inference.registry import ModelRegistry, ModelRoute

#: a stage boundary for the per-stage timer (``Metrics.stage_timer``); a no-op by default
Lap = Callable[[str], None]


def _no_lap(stage: str) -> None:
    return None


def _code_off(tenant: str | None) -> str | None:
    return CODE_OFF


class Resolver:
    def __init__(
        self,
        registry: ModelRegistry,
        store: ResponseStore,
        metrics: Metrics,
        sealer: Sealer,
        compactor: Compactor,
        pending_write: Callable[[str], Awaitable[None]],
        hosted_tools: HostedToolPolicy = "strip",
        offload: PrepareOffload | None = None,
        conversations: Conversations | None = None,
        prefix: PrefixReuse | None = None,
        item_checks_bytes: int = 64 * 1024 * 1024,
        hosted: HostedTools | None = None,
        web: WebSearch | None = None,
        files: VectorStores | None = None,
        code_interpreter: Callable[[str | None], str | None] | None = None,
    ) -> None:
        """``code_interpreter(tenant)``: None when the gateway runs ``code_interpreter`` for that
        tenant, else why not (``gateway.turn.checks.code_interpreter_off``); its containers are
        set apart (:attr:`containers`). ``pending_write(id)`` waits for that response's store
        write, if one is in flight (a chained request that arrives before its parent landed).
        ``offload`` sizes a request its caller did not size (``resolve(cpu=None)``); without it
        everything runs inline."""
        self.offload = offload
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.sealer = sealer
        self.compactor = compactor
        self.pending_write = pending_write
        #: tool lists already checked (``gateway.turn.checks.ToolChecks``)
        self.tool_checks = ToolChecks(
            hosted_tools,
            web_search=web.enabled if web is not None else lambda t: False,
            file_search=files is not None,
            code_interpreter=code_interpreter if code_interpreter is not None else _code_off,
        )
        #: input items already checked, for requests that re-send the conversation (``ItemChecks``)
        self.item_checks = ItemChecks(item_checks_bytes)
        self.conversations = conversations
        self.prefix = prefix
        #: the MCP servers requests may use (``gateway.tools.hosted``)
        self.hosted = hosted
        #: the ``web_search`` backends (``gateway.tools.web``)
        self.web = web
        #: the vector stores ``file_search`` searches (``gateway.files.vector_stores``)
        self.files = files
        #: the containers ``code_interpreter`` runs code in (``gateway.containers``; set by the pipeline)
        self.containers: Containers | None = None
        #: the stripped-hosted-tools counter's children by type (``labels()`` is a Python call a turn)
        self._stripped: dict[str, Any] = {}

    async def resolve(
        self, body: Any, ctx: TurnContext, *, generate: bool | None = None, lap: Lap = _no_lap, cpu: Cpu | None = None
    ) -> TurnInput:
        """``generate`` overrides the request's own (``input_tokens`` counts a generating prompt;
        ``/responses/compact`` does not generate). ``cpu`` runs the CPU pieces (None: sized here)."""
        if cpu is None:
            cpu = self.offload.for_body(body) if self.offload is not None else INLINE
        req, raw_items, route, checked, known = await cpu(self._validate, body, ctx.transport, ctx.tenant)
        tools = checked.tools
        gen = (req.generate is not False) if generate is None else generate
        lap("validate")

        cid = req.conversation_id
        conv = None if cid is None else await self.conversations.base(cid, ctx.tenant)  # type: ignore[union-attr]
        parent = conv.parent if conv is not None else await self.parent(req.previous_response_id, ctx)
        base_context = parent.context if parent is not None else ItemLog()
        stored = await self._stored_items(raw_items, base_context, ctx)
        lap("resolve")
        new_items, new_calls = await cpu(self._new_items, raw_items, base_context, stored, known, ctx.tenant)
        resent: list[Item] = []  # the implied parent's context, as the client re-sent it
        if parent is None and stored and conv is None:
            implied = await self._implied_parent(raw_items, new_items, stored, ctx, cpu)
            if implied is not None:
                parent, base_context = implied, implied.context
                resent, new_items = new_items[: len(base_context)], new_items[len(base_context) :]
                new_calls = _calls_of(new_items)
        new_items, compacted, trigger, pending = await cpu(self._window, new_items, base_context, parent, gen)
        if compacted and parent is not None:
            parent, base_context, resent = None, ItemLog(), []
        lap("validate")  # the new items are validated against the resolved parent
        hosted = await self._hosted(checked.mcp, tools, new_items, parent, base_context, ctx)
        if checked.web is not None and self.web is not None:
            hosted = msgspec.structs.replace(hosted, web=self.web.tool(*checked.web, ctx.tenant, req.include or ()))
        if checked.files is not None and self.files is not None:
            file_tool = await check_file_tool(self.files, *checked.files, ctx.tenant, req.include or ())
            hosted = msgspec.structs.replace(hosted, files=file_tool)
        if checked.code is not None:
            if self.containers is None:
                raise ApiError(
                    503,
                    "code_interpreter is enabled but this gateway has no containers to run code in.",
                    type="server_error",
                    code="service_unavailable",
                    param=f"tools[{checked.code[0]}]",
                )
            used = calls_used(new_items, parent.context if parent is not None else ())
            code_tool = await check_code_tool(
                self.containers, *checked.code, ctx.tenant, req.include or (), used=used, generate=gen
            )
            hosted = msgspec.structs.replace(hosted, code=code_tool)
        if hosted.active:  # the model sees the servers' tools and the browser, not the hosted tools themselves
            model_tools = tuple(t for t in tools if t["type"] not in GATEWAY_RUN_TYPES)
            searches: tuple[dict[str, Any], ...] = (file_search_namespace(),) if hosted.files is not None else ()
            builtin: tuple[str, ...] = (BROWSER,) if hosted.web is not None else ()
            if hosted.code is not None:  # gpt-oss's own python; other families a namespace of one function
                if route.renderer.family == "harmony":
                    builtin += (PYTHON,)
                else:
                    searches += (python_namespace(),)
            prelude = prelude_of(
                req,
                model_tools + hosted.namespaces + searches,
                hosted_choice(req.tool_choice, hosted),
                builtin=builtin,
            )
            lap("hosted")
        else:
            prelude = prelude_of(req, tools)
        prefix = None
        if parent is None and conv is None and self.prefix is not None:  # a conversation has its own tip
            prefix = await cpu(
                self.prefix.match,
                new_items,
                new_calls,
                route,
                prelude,
                ctx.tenant,
                req.cache_salt,
                known.digests if known is not None else None,
            )
            lap("render")  # the lookup renders what it compares
        digest = prefix.digest if prefix is not None else None
        later = False
        if parent is not None and conv is None and not resent and self.prefix is not None:
            # a chained turn names the prefix a client re-sending the whole history would send
            # (a reconnecting Codex does): O(parent's output + new items). A small turn's is folded
            # when its state is built (after the terminal event; before it for store=true, whose
            # state is written first): not before the first token, and never for a turn that fails
            # or is cut; a big one's — it may be a 10 MB tool output — here, where the lookup is
            # (the prepare pool), never on the loop
            if cpu.inline:
                later = True
            else:
                digest = await cpu(self.prefix.extend, parent, new_items)
        return TurnInput(
            req=req,
            route=route,
            tools=tools,
            prelude=prelude,
            parent=parent,
            base_context=base_context,
            new_items=tuple(new_items),
            input_items=(*resent, *new_items),
            new_calls=new_calls,
            pending_calls=pending,
            compact_trigger=trigger,
            generate=gen,
            store=True if req.store is None else req.store,
            conversation=conv.ref if conv is not None else None,
            prefix=prefix,
            digest=digest,
            digest_later=later,
            hosted=hosted,
        )

    async def _hosted(
        self,
        mcp: tuple[tuple[int, McpTool], ...],
        tools: tuple[dict[str, Any], ...],
        new_items: list[Item],
        parent: ResponseState | None,
        context: ItemLog,
        ctx: TurnContext,
    ) -> HostedTurn:
        """The turn's MCP servers, checked and listed, and the calls its approvals let run."""
        answers = [it for it in new_items if it.get("type") == "mcp_approval_response"]
        if not mcp and not answers:
            return NO_HOSTED
        if self.hosted is None:  # a pipeline built without the hosted-tools service (some tests)
            raise bad_request("MCP tools are not enabled on this gateway.", code="unsupported_parameter", param="tools")
        taken = {t["name"] for t in tools if t["type"] != "mcp"}
        servers = self.hosted.servers(mcp, ctx.tenant, taken)
        labels = {s.label for s in servers}
        approved: list[Item] = []
        for i, request, approve in approvals_to_run(new_items, _ById(context)):
            if not approve:
                continue  # a refusal is rendered from the response item itself
            if request.get("server_label") not in labels:
                raise bad_request(
                    f"Approving a call on MCP server '{request.get('server_label')}' needs that server in 'tools'.",
                    code="invalid_value",
                    param=f"input[{i}]",
                )
            approved.append(dict(request))
        if not servers:
            return NO_HOSTED
        before = set(parent.mcp_listed) if parent is not None else set()
        before.update(str(it.get("server_label")) for it in new_items if it.get("type") == "mcp_list_tools")
        return await self.hosted.prepare(servers, ctx.tenant, before, approved)

    def _validate(
        self,
        body: Any,
        transport: Transport,
        tenant: str | None,
    ) -> tuple[CreateRequest, list[Any], ModelRoute, CheckedTools, _KnownItems | None]:
        """The request checked and parsed, its model and tools (CPU only: may run in the pool). Tools
        byte-identical to a list this tenant offered before are not validated again: the rest of
        the body is, and the request gets that list's models (``ToolChecks``); so are the items a
        request re-sending its conversation sent before (``ItemChecks``)."""
        key = ToolChecks.key(body) if isinstance(body, dict) else None
        known_tools = self.tool_checks.get(tenant, key) if key is not None else None
        known = _known_items(body, self.item_checks, tenant)
        models = [c.model if c is not None else None for c in known.checked] if known is not None else None
        if known_tools is None:
            req, raw_items = parse_create(body, transport=transport, known=models)
        else:
            rest = dict(body)  # a copy less one key, in C (a comprehension would visit every key)
            del rest["tools"]
            req, raw_items = parse_create(rest, transport=transport, known=models)
            req.tools = known_tools.models
        check_supported(req, transport)
        route = route_of(req, self.registry)
        checked = known_tools if known_tools is not None else self.tool_checks.check(req, tenant, key)
        for kind in checked.stripped:  # what the model was not shown, per request (Codex: every frame)
            counter = self._stripped.get(kind)
            if counter is None:  # a type of HOSTED_TOOL_TYPES: a bounded set of children
                counter = self._stripped[kind] = self.metrics.hosted_tools_stripped.labels(kind)
            counter.inc()
        check_tool_choice(req, checked.names)
        return req, raw_items, route, checked, known

    async def parent(self, previous_response_id: str | None, ctx: TurnContext) -> ResponseState | None:
        """The response a continuation names: this connection's cache first, then the shared store."""
        prev = previous_response_id
        if prev is None:
            return None
        if ctx.conn_cache is not None:
            state = ctx.conn_cache.get(prev)
            self.metrics.conn_cache.labels("miss" if state is None else "hit").inc()
            if state is not None:
                self.metrics.parent_resolution.labels("connection").inc()
                return state
        await self.pending_write(prev)
        t0 = time.perf_counter()
        try:
            state = await self.store.get(prev, ctx.tenant)
        except StoreUnavailable:
            self.metrics.parent_resolution.labels("unavailable").inc()
            raise store_unavailable() from None
        finally:
            self.metrics.store_latency.labels("get").observe(time.perf_counter() - t0)
        if state is not None and state.status in CHAINABLE:
            self.metrics.parent_resolution.labels("store").inc()
            return state
        self.metrics.parent_resolution.labels("not_found").inc()
        self.metrics.not_found.labels(ctx.transport).inc()
        raise previous_response_not_found(prev)

    async def _stored_items(self, raw_items: list[Any], context: ItemLog, ctx: TurnContext) -> dict[str, StoredItem]:
        """The references the parent's context does not hold, and the re-sent calls it does not hold
        (by the call id the gateway issued), looked up among the tenant's stored items."""
        wanted = [raw.id for raw in raw_items if isinstance(raw, ItemReference) and not context.has_id(raw.id)]
        wanted += [
            call_key(raw.call_id)
            for raw in raw_items
            if isinstance(raw, (FunctionCall, CustomToolCall)) and context.call(raw.call_id) is None
        ]
        if not wanted:
            return {}
        t0 = time.perf_counter()
        try:
            return await self.store.items(wanted, ctx.tenant)
        except StoreUnavailable:
            raise store_unavailable() from None
        finally:
            self.metrics.store_latency.labels("items").observe(time.perf_counter() - t0)

    async def _implied_parent(
        self,
        raw_items: list[Any],
        items: list[Item],
        stored: dict[str, StoredItem],
        ctx: TurnContext,
        cpu: Cpu = INLINE,
    ) -> ResponseState | None:
        """The stored response whose whole context the input begins with (see the module docstring)."""
        last = next((key for raw in reversed(raw_items) if (key := _index_key(raw)) in stored), None)
        if last is None:
            return None
        home = stored[last].response_id
        state = ctx.conn_cache.get(home) if ctx.conn_cache is not None else None
        if state is None:
            try:
                state = await self.store.get(home, ctx.tenant)
            except StoreUnavailable:
                raise store_unavailable() from None
        if state is None or state.status not in CHAINABLE or len(state.context) > len(items):
            return None
        if not await cpu(_begins_with, items, state.context):
            return None
        self.metrics.parent_resolution.labels("items").inc()
        return state

    def _new_items(
        self,
        raw_items: list[Any],
        context: ItemLog,
        stored: dict[str, StoredItem],
        known: _KnownItems | None = None,
        tenant: str | None = None,
    ) -> tuple[list[Item], dict[str, Item]]:
        items: list[Item] = []
        seen: set[str] = set()
        calls: dict[str, Item] = {}
        for i, raw in enumerate(raw_items):
            hit = known.checked[i] if known is not None else None
            if hit is not None:  # checked before: its canonical item, with an id of this turn's if it had none
                item = dict(hit.item)
                if hit.id_prefix is not None:
                    item["id"] = new_id(hit.id_prefix)
                if hit.digest is not None and known is not None:
                    known.digests[id(item)] = (item, hit.digest)
            elif isinstance(raw, str):
                item = canonical_item(Message(role="user", content=raw))
            elif isinstance(raw, ItemReference):
                ref = context.get(raw.id)
                if ref is None and raw.id in stored:
                    ref = stored[raw.id].item
                if ref is None:
                    raise bad_request(
                        f"Item with id '{raw.id}' not found.", code="invalid_value", param=f"input[{i}].id"
                    )
                item = ref
            elif isinstance(raw, HostedItem):
                item = raw.model_dump(exclude_none=True)
            else:
                item = canonical_item(raw)
                if isinstance(raw, Reasoning):
                    item = self._unseal(item, i)
                elif isinstance(raw, Compaction):
                    item = self.compactor.input_item(item, i)
                key = known.keys[i] if known is not None else None
                if key is not None:
                    given = raw.id is None and isinstance(item.get("id"), str)
                    try:
                        link: bytes | None = item_digest(item)
                    except (TypeError, orjson.JSONEncodeError):
                        link = None  # not hashable as the prefix cache hashes: it never caches this request
                    self.item_checks.keep(
                        tenant,
                        key,
                        CheckedItem(
                            raw,
                            {k: v for k, v in item.items() if k != "id"} if given else dict(item),
                            item["id"].rsplit("_", 1)[0] if given else None,
                            link,
                        ),
                    )
            item_id = item.get("id")
            if item_id and not isinstance(raw, ItemReference):
                if item_id in seen or context.has_id(item_id):
                    raise bad_request(
                        f"Duplicate item found with id {item_id}. "
                        "Remove duplicate items from your input and try again.",
                        code="invalid_value",
                        param="input",
                    )
                seen.add(item_id)
            if item.get("type") in CALL_TYPES:
                calls[item["call_id"]] = item
            elif item.get("type") == ItemType.MCP_APPROVAL_REQUEST and (call := call_of(item)) is not None:
                calls[call["call_id"]] = call  # a refusal is rendered under its tool's name
            items.append(item)
        return items, calls

    def _window(
        self,
        new_items: list[Item],
        context: ItemLog,
        parent: ResponseState | None,
        generate: bool,
    ) -> tuple[list[Item], bool, bool, frozenset[str]]:
        """The compaction window over the new items, then their call pairing against the parent, or
        against nothing when a compaction item replaced it (one piece of CPU work: one hop)."""
        new_items, compacted, trigger = self.compactor.window(new_items)
        if compacted and parent is not None:
            parent, context = None, ItemLog()
        return new_items, compacted, trigger, _check_pairing(new_items, context, parent, generate)

    def _unseal(self, item: Item, i: int) -> Item:
        blob = item.get("encrypted_content")
        if not blob or item.get("content"):
            return item
        try:
            text = self.sealer.open(blob)
        except SealError as exc:
            raise bad_request(
                f"Invalid 'input[{i}].encrypted_content': {exc}.",
                code="invalid_encrypted_content",
                param=f"input[{i}].encrypted_content",
            ) from None
        return dict(item, content=[{"type": "reasoning_text", "text": text}])


class _KnownItems:
    """A request's input items as :class:`ItemChecks` names them (``keys``) and what it found there."""

    __slots__ = ("keys", "checked", "digests")

    def __init__(self, keys: list[bytes | None], checked: list[CheckedItem | None]) -> None:
        self.keys = keys
        self.checked = checked
        #: the found items' prefix-digest links, by the item built from each (``prefix.digests(known=...)``)
        self.digests: dict[int, tuple[Item, bytes]] = {}


def _known_items(body: Any, checks: ItemChecks, tenant: str | None) -> _KnownItems | None:
    """The items of a request that re-sends its conversation — no ``previous_response_id`` and no
    ``conversation``, more than one item — as the item checks know them; None for any other
    (a continuation's new items were never sent before: looking them up would only cost)."""
    if (
        not checks.on
        or not isinstance(body, dict)
        or body.get("previous_response_id") is not None
        or body.get("conversation") is not None
    ):
        return None
    raw = body.get("input")
    if not isinstance(raw, list) or len(raw) < 2:
        return None
    keys = checks.keys(raw)
    return _KnownItems(keys, checks.found(tenant, keys))


#: keys that differ between an item a client re-sends and the one the server kept (same rendering)
_VOLATILE = frozenset({"id", "status"})
#: values a client may leave out that the kept item spells out
_DEFAULTS = {"phase": "final_answer"}


def _index_key(raw: Any) -> str | None:
    """How the store's index names this input item: a reference by its id, a re-sent call by its call id."""
    if isinstance(raw, ItemReference):
        return raw.id
    if isinstance(raw, (FunctionCall, CustomToolCall)):
        return call_key(raw.call_id)
    return None


def _view(item: Item) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _VOLATILE and v is not None and _DEFAULTS.get(k) != v}


def _begins_with(items: list[Item], context: ItemLog) -> bool:
    return all(_same_item(a, b) for a, b in zip(items, context))


def _same_item(sent: Item, kept: Item) -> bool:
    """The re-sent item stands for the kept one: equal but for ids, status and unset fields; a
    function call's arguments may be re-serialized (the AI SDK sends ``JSON.stringify`` of the parsed
    input, not the text the model sampled) — the kept, sampled form is what the model saw."""
    if sent is kept:
        return True
    a, b = _view(sent), _view(kept)
    if a == b:
        return True
    if a.get("type") != ItemType.FUNCTION_CALL or a.keys() != b.keys():
        return False
    if any(a[k] != b[k] for k in a if k != "arguments"):
        return False
    try:
        same: bool = orjson.loads(a["arguments"]) == orjson.loads(b["arguments"])
        return same
    except (orjson.JSONDecodeError, TypeError):
        return False


def _check_pairing(items: list[Item], context: ItemLog, parent: ResponseState | None, generate: bool) -> frozenset[str]:
    """Every tool output answers a call made before it; a generating turn leaves no call unanswered."""
    pending = set(parent.pending_calls) if parent is not None else set()
    local_calls: set[str] = set()
    for item in items:
        t = item.get("type")
        if t in CALL_TYPES:
            pending.add(item["call_id"])
            local_calls.add(item["call_id"])
        elif t in OUTPUT_TYPES:
            call_id = item["call_id"]
            if call_id not in local_calls and context.call(call_id) is None:
                raise bad_request(f"No tool call found for function call output with call_id {call_id}.", param="input")
            pending.discard(call_id)
    if generate and pending:
        call_id = next(iter(sorted(pending)))
        raise bad_request(f"No tool output found for function call {call_id}.", param="input")
    return frozenset(pending)


def _calls_of(items: list[Item]) -> dict[str, Item]:
    """call id -> call, of ``items``: the client-answered calls, and MCP approval requests as the
    calls they stand for (``inference.hosted_items.call_of``)."""
    out: dict[str, Item] = {}
    for it in items:
        if it.get("type") in CALL_TYPES:
            out[it["call_id"]] = it
        elif it.get("type") == ItemType.MCP_APPROVAL_REQUEST and (call := call_of(it)) is not None:
            out[call["call_id"]] = call
    return out


class _ById(Mapping[str, Mapping[str, Any]]):
    """The parent's items by id, lookup only (an approval request is found without a scan)."""

    def __init__(self, context: ItemLog) -> None:
        self._context = context

    def __getitem__(self, item_id: str) -> Mapping[str, Any]:
        item = self._context.get(item_id)
        if item is None:
            raise KeyError(item_id)
        return item

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
