"""Request checks: what a create may ask for before anything is resolved or rendered.

Parameters the gateway does not serve (background mode over WebSocket, stored prompts) and what
background mode needs (``store``), tool definitions (hosted tools stripped or refused, asynchronous
tools refused) and ``tool_choice`` against the tools. Each refusal is OpenAI's error for it, naming
the parameter. The checks are pure functions of the request, with no I/O; the two caches below keep
what they made of the parts a client re-sends.

**Tool lists checked once.** A coding agent re-sends the same tools with every turn (Codex: ~10 KB
of JSON schemas); validating them, building the tools the turn uses and echoes, and their names
cost ~0.25 ms a turn, more than the rest of a short continuation's checks. :class:`ToolChecks`
keeps what the checks made of a tool list under its exact JSON (orjson's bytes of the parsed list:
C speed, and different for ``1``, ``1.0`` and ``true``, or for another key order, where ``==`` would
not be), per tenant, so a turn offering byte-identical tools takes the earlier turn's result: the
same objects, which nothing downstream changes (the renderers, the parsers and the Response echo
only read them). A check that failed is never kept.

**Items checked once.** A request that re-sends the whole conversation (Codex's HTTP transport,
the AI SDK with ``store: false``) re-sends every earlier item too; :class:`ItemChecks` keeps, per
tenant and exact JSON of an item, its validated model and canonical item (reasoning unsealed), so
such a request validates and builds only the items it had not sent before. An item's check is a
pure function of its JSON (for the item types kept here: a reference resolves against the
conversation, a compaction against the compactor, so neither is kept); what depends on the rest of
the request (duplicate ids, call pairing, the parent) is still checked every turn. An id the gateway
gave an item sent without one is not kept: each turn gives its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from cache.lru import BoundedLRU, tenant_of
from gateway.tools.calls import FILE_SEARCH_NAMESPACE
from gateway.turn.types import Transport
from gateway.wire.errors import ApiError, bad_request, model_not_found, unknown_parameter
from gateway.wire.kinds import CALL_TYPES, OUTPUT_TYPES
from gateway.wire.request import CreateRequest
from gateway.wire.tools import (
    WEB_SEARCH_TYPES,
    CodeInterpreterTool,
    FileSearchTool,
    HostedTool,
    McpTool,
    WebSearchTool,
    canonical_tool,
    tool_names,
)
from gateway.wire.validation import json_type, to_api_error
from inference.browser_tool import BROWSER
from inference.item_types import ItemType, ToolType
from inference.python_tool import PYTHON, RUN
from inference.registry import ModelRegistry, ModelRoute
from inference.renderer import Prelude

HostedToolPolicy = Literal["strip", "reject"]
#: why ``code_interpreter`` is refused when the gateway's setting is off (``code_interpreter_off``)
CODE_OFF = "the gateway's setting code_interpreter is 'off'"
#: ... when it is on for other tenants only
CODE_NOT_TENANT = "this tenant is not in the gateway's setting code_interpreter_tenants"


def code_interpreter_off(settings: Any, tenant: str | None) -> str | None:
    """None when ``code_interpreter`` runs for ``tenant``, else why not (the 400's words)."""
    if settings.code_interpreter == "off":
        return CODE_OFF
    allowed = settings.code_interpreter_tenants
    if allowed is not None and tenant not in allowed:
        return CODE_NOT_TENANT
    return None


def check_params(body: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """A body limited to ``allowed`` top-level keys (endpoints narrower than a create)."""
    allowed = frozenset(allowed)
    for key in body:
        if key not in allowed:
            raise unknown_parameter(key)


def check_supported(req: CreateRequest, transport: Transport) -> None:
    if req.background:
        if transport == "ws":  # the WebSocket-mode spec: background stays an HTTP feature
            raise ApiError(
                400,
                "background mode is not supported over WebSocket.",
                code="unsupported_parameter",
                param="background",
            )
        if req.store is False:  # polling, cancel and resume all read the stored response
            raise bad_request("Background mode requires 'store' to be true.", code="invalid_value", param="store")
    window = req.background_options.completion_window if req.background_options is not None else None
    if window in ("2h", "8h") and (not req.background or req.stream):
        raise bad_request(
            f"The '{window}' completion window requires 'background' to be true and 'stream' to be false.",
            code="invalid_value",
            param="background_options.completion_window",
        )
    if req.conversation is not None:
        if req.previous_response_id is not None:
            raise bad_request(
                "'previous_response_id' and 'conversation' cannot be used together.",
                code="invalid_request",
                param="conversation",
            )
        _check_conversation_input(req.input)
    if req.prompt is not None:
        raise ApiError(
            400, "Stored prompts are not supported by this gateway.", code="unsupported_parameter", param="prompt"
        )


def _check_conversation_input(raw: Any) -> None:
    """A client's ``compaction`` item replaces everything before it, which in a conversation would be
    the conversation itself; compaction in a conversation is ``context_management``'s (its output
    item is appended and windows the conversation's later turns, ``gateway.turn.conversation``)."""
    if not isinstance(raw, list):
        return
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("type") == "compaction":
            raise ApiError(
                400,
                "A compaction input item cannot be used with 'conversation': the conversation "
                "keeps its own items. Use context_management to compact a conversation.",
                code="unsupported_parameter",
                param=f"input[{i}]",
            )


class CheckedTools:
    """A tool list as the checks made it: the validated models (``CreateRequest.tools``), the tools as
    the turn uses and echoes them, and their names (for ``tool_choice`` and parsed calls)."""

    __slots__ = ("models", "tools", "names", "mcp", "stripped", "web", "files", "code")

    def __init__(
        self,
        models: list[Any],
        tools: tuple[dict[str, Any], ...],
        stripped: tuple[str, ...] = (),
        web: tuple[int, WebSearchTool] | None = None,
        files: tuple[int, FileSearchTool] | None = None,
        code: tuple[int, CodeInterpreterTool] | None = None,
    ) -> None:
        self.models = models
        self.tools = tools
        #: the ``web_search`` tool the gateway runs (with its index), when this tenant has a backend
        self.web = web
        #: the ``file_search`` tool the gateway runs (with its index) over the tenant's vector stores
        self.files = files
        #: the ``code_interpreter`` tool the gateway runs (with its index) in the tenant's containers
        self.code = code
        #: the hosted tool types the gateway does not run, left out (``hosted_tools="strip"``): each
        #: request that sends them counts them (``respgate_hosted_tools_stripped_total``)
        self.stripped = stripped
        self.names = tool_names(tools)
        #: the ``mcp`` tools with their index (``gateway.tools.hosted``: the gateway runs them)
        self.mcp: tuple[tuple[int, McpTool], ...] = tuple(
            (i, m) for i, m in enumerate(models) if isinstance(m, McpTool)
        )


NO_TOOLS = CheckedTools([], ())


class ToolChecks:
    """Checked tool lists by tenant and exact JSON (see the module docstring), bounded by entries and
    bytes, and each tenant by its share of them (``cache.lru``); another tenant's entries are never
    read."""

    def __init__(
        self,
        hosted: HostedToolPolicy,
        max_entries: int = 64,
        max_bytes: int = 16 * 1024 * 1024,
        web_search: Callable[[str | None], bool] = lambda tenant: False,
        file_search: bool = False,
        code_interpreter: Callable[[str | None], str | None] = lambda tenant: CODE_OFF,
    ) -> None:
        """``web_search(tenant)``: whether the gateway runs ``web_search`` for that tenant (a backend
        is configured for it); when not, the tool is stripped like any hosted tool.
        ``code_interpreter(tenant)``: None when the gateway runs ``code_interpreter`` for that
        tenant, else the setting that keeps it off (a request naming it is then a 400 naming it)."""
        self.hosted = hosted
        self.web_search = web_search
        self.code_interpreter = code_interpreter
        #: whether the gateway runs ``file_search`` (it has vector stores); when not, it is stripped
        self.file_search = file_search
        self.lru: BoundedLRU[tuple[str | None, bytes], CheckedTools] = BoundedLRU(
            max_entries, max_bytes, part=tenant_of
        )

    @staticmethod
    def key(body: Mapping[str, Any]) -> bytes | None:
        """The create's tools as the cache names them: their JSON, when they are a non-empty list."""
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        try:
            return orjson.dumps(tools)
        except (orjson.JSONEncodeError, TypeError):  # nothing a parsed body holds; checked the long way
            return None

    def known_for(self, tenant: str | None) -> Callable[[Any], bool]:
        """For one frame's bounds checks (``gateway.wire.validation``), before it is parsed into a
        request: whether a parsed ``tools`` value is a list this tenant offered and passed before,
        so its depth and schema sizes were checked then (the same bounds: they are settings).
        The answer is kept for the object asked about: a frame's checks serialize its tools once."""
        asked: Any = None
        answer = False

        def known(tools: Any) -> bool:
            nonlocal asked, answer
            if tools is not asked:
                key = self.key({"tools": tools})
                asked, answer = tools, key is not None and (tenant, key) in self.lru
            return answer

        return known

    def get(self, tenant: str | None, key: bytes) -> CheckedTools | None:
        hit: CheckedTools | None = self.lru.get((tenant, key))
        return hit

    def check(self, req: CreateRequest, tenant: str | None, key: bytes | None) -> CheckedTools:
        """``req``'s tools checked (raises ``ApiError``), and kept under ``key`` when it names them."""
        if not req.tools:
            return NO_TOOLS
        checked = CheckedTools(
            req.tools,
            *_tools(req, self.hosted, self.web_search(tenant), self.file_search, self.code_interpreter(tenant)),
        )
        if key is not None and not checked.mcp:  # MCP credentials are kept for the turn only
            # the key, the models, the dicts: each about the JSON's size
            self.lru.put((tenant, key), checked, 4 * len(key) + 256)
        return checked


#: items whose checked form depends on their JSON alone (see the module docstring)
KEPT_ITEM_TYPES = frozenset(
    {
        ItemType.MESSAGE,
        ItemType.FUNCTION_CALL,
        ItemType.FUNCTION_CALL_OUTPUT,
        ItemType.CUSTOM_TOOL_CALL,
        ItemType.CUSTOM_TOOL_CALL_OUTPUT,
        ItemType.REASONING,
    }
)


class CheckedItem:
    """An input item as the checks made it: the validated model, the canonical item (without an id
    the gateway gave it) and, when it had to be given one, the id's prefix."""

    __slots__ = ("model", "item", "id_prefix", "digest")

    def __init__(self, model: Any, item: dict[str, Any], id_prefix: str | None, digest: bytes | None) -> None:
        self.model = model
        self.item = item
        self.id_prefix = id_prefix
        #: the item's link in the prefix digests (``gateway.turn.prefix.item_digest``: ids left out)
        self.digest = digest


class ItemChecks:
    """Checked input items by tenant and exact JSON, bounded by entries and bytes, and each tenant by
    its share of them (``cache.lru``)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_entries: int = 65_536) -> None:
        #: off (0 bytes): nothing is looked up or kept
        self.on = max_bytes > 0
        self.lru: BoundedLRU[tuple[str | None, bytes], CheckedItem] = BoundedLRU(max_entries, max_bytes, part=tenant_of)

    @staticmethod
    def keys(raw: list[Any]) -> list[bytes | None]:
        """Each raw item's name here: its JSON, for an object of a kept type (else None)."""
        out: list[bytes | None] = []
        for item in raw:
            key = None
            kind = item.get("type") if isinstance(item, dict) else None
            if kind is None and isinstance(item, dict) and "role" in item:
                kind = ItemType.MESSAGE
            if isinstance(kind, str) and kind in KEPT_ITEM_TYPES:
                try:
                    key = orjson.dumps(item)
                except (orjson.JSONEncodeError, TypeError):
                    key = None
            out.append(key)
        return out

    def found(self, tenant: str | None, keys: list[bytes | None]) -> list[CheckedItem | None]:
        named = [(i, key) for i, key in enumerate(keys) if key is not None]
        out: list[CheckedItem | None] = [None] * len(keys)
        for (i, _), hit in zip(named, self.lru.get_many([(tenant, key) for _, key in named])):
            out[i] = hit
        return out

    def keep(self, tenant: str | None, key: bytes, checked: CheckedItem) -> None:
        # the key, the model and the canonical item: each about the JSON's size
        self.lru.put((tenant, key), checked, 3 * len(key) + 512)


def route_of(req: CreateRequest, registry: ModelRegistry) -> ModelRoute:
    """The served model the create names."""
    route = registry.get(req.model)
    if route is None:
        raise model_not_found(req.model)
    return route


def prelude_of(
    req: CreateRequest, tools: tuple[dict[str, Any], ...], tool_choice: Any = None, builtin: tuple[str, ...] = ()
) -> Prelude:
    """``tool_choice``: the request's, unless the caller translated it (``hosted_choice``);
    ``builtin``: the built-in tools the model is offered (``inference.browser_tool``)."""
    choice = tool_choice if tool_choice is not None else req.tool_choice
    return Prelude(
        instructions=req.instructions,
        tools=tools,
        tool_choice="auto" if choice is None else choice,
        reasoning_effort=req.reasoning.effort if req.reasoning else None,
        builtin=builtin,
    )


def hosted_choice(choice: Any, hosted: Any) -> Any:
    """``tool_choice`` as the model's tools name it once MCP servers are namespaces:
    ``{"type": "mcp", "server_label": L, "name": N}`` is that namespace's function; without a name,
    any tool of the server (``allowed_tools``, required). Raises ``ApiError`` for an unknown server
    or tool. Other choices are unchanged."""
    if isinstance(choice, dict) and choice.get("type") in WEB_SEARCH_TYPES:
        if hosted.web is None:
            return "auto"  # stripped with the tool
        # the browser's search: a chat template's grammar forces the call (its browser is a namespace
        # of functions); harmony's browser is built in, outside the tools a grammar names: ``auto``
        return {"type": "function", "name": "search", "namespace": BROWSER}
    if isinstance(choice, dict) and choice.get("type") == "file_search":
        if getattr(hosted, "files", None) is None:
            return "auto"  # stripped with the tool
        return {"type": "function", "name": "msearch", "namespace": FILE_SEARCH_NAMESPACE}
    if isinstance(choice, dict) and choice.get("type") == "code_interpreter":
        if getattr(hosted, "code", None) is None:
            return "auto"
        # the namespace's function for a chat template; harmony's python is built in (no function to
        # force: its constraint leaves an unknown choice free, as for the browser)
        return {"type": "function", "name": RUN, "namespace": PYTHON}
    if not isinstance(choice, dict) or choice.get("type") != "mcp":
        return choice
    label = choice.get("server_label")
    if not isinstance(label, str) or label not in hosted.servers:
        raise bad_request(
            f"Tool choice MCP server '{str(label)[:64]}' not found in 'tools' parameter.",
            code="invalid_value",
            param="tool_choice.server_label",
        )
    tools = hosted.tools.get(label, {})
    name = choice.get("name")
    if name is not None:
        if name not in tools:
            raise bad_request(
                f"Tool choice '{str(name)[:64]}' is not a tool of MCP server '{label}'.",
                code="invalid_value",
                param="tool_choice.name",
            )
        return {"type": "function", "name": name, "namespace": label}
    if not tools:
        return "auto"  # the server listed nothing (or failed): nothing to require
    return {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": n, "namespace": label} for n in tools],
    }


def _tools(
    req: CreateRequest,
    hosted: HostedToolPolicy,
    web: bool = False,
    files: bool = False,
    code_off: str | None = CODE_OFF,
) -> tuple[
    tuple[dict[str, Any], ...],
    tuple[str, ...],
    tuple[int, WebSearchTool] | None,
    tuple[int, FileSearchTool] | None,
    tuple[int, CodeInterpreterTool] | None,
]:
    """The tools the turn uses, the hosted tool types it left out, and the ``web_search``,
    ``file_search`` and ``code_interpreter`` tools the gateway runs (``web``: a backend serves this
    tenant; ``files``: the gateway has vector stores; ``code_off``: None when code_interpreter is on
    for this tenant, else the setting that keeps it off: never stripped, a 400 naming the setting).
    One of each: a second is a 400."""
    out: list[dict[str, Any]] = []
    stripped: list[str] = []
    run: dict[str, tuple[int, Any]] = {}
    for i, tool in enumerate(req.tools or []):
        model: type[WebSearchTool] | type[FileSearchTool] | type[CodeInterpreterTool] | None = None
        if isinstance(tool, HostedTool) and web and tool.type in WEB_SEARCH_TYPES:
            model, kind = WebSearchTool, "web_search"
        elif isinstance(tool, HostedTool) and files and tool.type == "file_search":
            model, kind = FileSearchTool, "file_search"
        elif isinstance(tool, HostedTool) and tool.type == "code_interpreter":
            if code_off is not None:
                raise ApiError(
                    400,
                    f"Tool type 'code_interpreter' (tools[{i}]) is not enabled for this request: {code_off}.",
                    code="unsupported_value",
                    param=f"tools[{i}]",
                )
            model, kind = CodeInterpreterTool, "code_interpreter"
        if model is not None:
            if kind in run:
                raise bad_request(f"Only one {kind} tool may be given.", code="invalid_value", param=f"tools[{i}].type")
            try:
                checked = model.model_validate(tool.model_dump())
            except ValidationError as exc:
                raise _at_tool(to_api_error(exc), i) from None
            run[kind] = (i, checked)
            out.append(checked.echo())
            continue
        if isinstance(tool, HostedTool):
            if hosted == "reject":
                raise ApiError(
                    400,
                    f"Tool type '{tool.type}' is not supported by this gateway.",
                    code="unsupported_value",
                    param=f"tools[{i}].type",
                )
            stripped.append(tool.type)  # one of HOSTED_TOOL_TYPES: a bounded label
            continue
        d = canonical_tool(tool)
        if d.get("async"):
            raise ApiError(
                400,
                "Asynchronous tools are not supported by this gateway.",
                code="unsupported_value",
                param=f"tools[{i}].async",
            )
        out.append(d)
    return tuple(out), tuple(stripped), run.get("web_search"), run.get("file_search"), run.get("code_interpreter")


def _at_tool(err: ApiError, i: int) -> ApiError:
    """A ``web_search`` or ``file_search`` tool's validation error, its ``param`` under ``tools[i]``."""
    param = f"tools[{i}].{err.param}" if err.param else f"tools[{i}]"
    return ApiError(err.status, err.message.replace(f"'{err.param}'", f"'{param}'"), code=err.code, param=param)


def check_tool_choice(req: CreateRequest, names: Mapping[tuple[str | None, str], str]) -> None:
    """``tool_choice`` against the tools offered (their :func:`tool_names`)."""
    tc = req.tool_choice
    if not isinstance(tc, dict):
        return
    kind = tc.get("type")
    if kind in (ToolType.FUNCTION, ToolType.CUSTOM):
        name = tc.get("name")
        if not isinstance(name, str):
            raise bad_request(
                f"Invalid type for 'tool_choice.name': expected a string, but got {json_type(name)} instead.",
                code="invalid_type",
                param="tool_choice.name",
            )
        if not any(n == name for (_, n) in names):
            raise bad_request(
                f"Tool choice '{name}' not found in 'tools' parameter.", code="invalid_value", param="tool_choice"
            )
    elif kind == "allowed_tools":
        if tc.get("mode") not in ("auto", "required") or not isinstance(tc.get("tools"), list):
            raise bad_request(
                "Invalid 'tool_choice': allowed_tools needs a mode and a tools list.",
                code="invalid_value",
                param="tool_choice",
            )
        for j, tool in enumerate(tc["tools"]):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                raise bad_request(
                    f"Invalid 'tool_choice.tools[{j}]': expected an object with a string 'type'.",
                    code="invalid_type",
                    param=f"tool_choice.tools[{j}]",
                )
    elif kind is None:
        raise bad_request("Invalid 'tool_choice': missing 'type'.", code="invalid_value", param="tool_choice")


def orphan_outputs(items: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """``(index, call_id)`` of each tool output in ``items`` whose call is not among the items before it.

    A renderer names a tool output by its call (harmony writes the call's tool name in the output's
    header), so an output without its call cannot be shown to the model."""
    calls: set[Any] = set()
    out: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind in CALL_TYPES:
            calls.add(item.get("call_id"))
        elif kind in OUTPUT_TYPES and item.get("call_id") not in calls:
            out.append((i, str(item.get("call_id"))))
    return out


def no_call_for(orphan: tuple[int, str], param: str = "items") -> ApiError:
    """The 400 for an orphan output among a conversation's new ``items``: the words a create's
    ``input`` gets for one (``gateway.turn.resolve``), naming the item."""
    i, call_id = orphan
    return bad_request(
        f"No tool call found for function call output with call_id {call_id}.",
        code="invalid_value",
        param=f"{param}[{i}]",
    )
