"""The MCP servers one turn may use, what they offer the model, and running their calls.

    request tools ──servers()──> McpServer per ``mcp`` tool   (400s: label, url, policy; no I/O)
                  ──prepare()──> HostedTurn                   (lists tools: the catalog, else the server)
    model's call  ──call()─────> ToolResult                   (bounded time and bytes; never raises)

**Who may reach what.** A request names a server by its own ``server_url`` — allowed when it starts
with one of the tenant's ``mcp_allowed_urls`` prefixes, and then only public addresses are reached
(``security.outbound``: every resolved address is checked, redirects included) — or by a
``server_label`` the operator configured (``mcp_servers``), whose URL and credentials stay on the
gateway and whose address the operator vouches for. Credentials a request carries (``headers``,
``authorization``) live in the :class:`McpServer` of the turn only: never stored, logged, traced,
echoed or billed.

**What the model sees.** Each server's tools (``allowed_tools`` applied) as one namespace tool named
by the server label, appended to the request's own tools: harmony renders it as a function
namespace, chat templates as their tools. A listing is new output (an ``mcp_list_tools`` item)
only the first time a chain uses the label; later turns reuse the catalog's copy
(``gateway.tools.catalog``: per tenant, server and credentials, with a TTL) without re-listing. A
server that cannot list its tools gets an ``mcp_list_tools`` item with ``error`` and the turn runs
without its tools: never a 5xx.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec
import orjson

from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.tools.approvals import ApprovalPolicy, Decision, ToolFilter, approval_policy
from gateway.tools.catalog import ToolCatalog
from gateway.tools.mcp_client import ListedTool, McpClient, McpEndpoint, McpError, ToolResult
from gateway.wire.errors import ApiError, bad_request
from gateway.wire.items import new_id
from gateway.wire.tools import TOOL_NAME, McpTool
from security.outbound import OutboundPolicy, mcp_client_factory

if TYPE_CHECKING:
    from gateway.tools.code_interpreter import CodeTool
    from gateway.tools.file_search import FileTool
    from gateway.tools.web import WebTool

log = logging.getLogger(__name__)

_NAME_OK = re.compile(TOOL_NAME)
#: labels a server may not take: harmony's own namespaces (the client's functions, built-in tools)
RESERVED_LABELS = frozenset({"functions", "browser", "python", "container", "assistant", "user", "system", "developer"})
#: the metric label of a server a request named by URL (its label is the client's: unbounded)
REQUEST_SERVER = "request"


class McpServer(msgspec.Struct, frozen=True):
    """One ``mcp`` tool of a request, checked: where it is, and what its calls may do."""

    label: str
    endpoint: McpEndpoint
    description: str
    #: ``allowed_tools`` (None: every tool the server lists)
    allowed: ToolFilter | None
    approval: ApprovalPolicy
    #: the label metrics and traces name it by: an operator's label, else ``request``
    metric_label: str


class HostedTurn(msgspec.Struct, frozen=True):
    """What the tools the gateway runs offer one turn: the MCP servers' tools, the model's view of
    them, the new listings, and the ``web_search`` tool (``gateway.tools.web``)."""

    servers: Mapping[str, McpServer]
    #: label -> tool name -> the listed tool (allowed ones only)
    tools: Mapping[str, Mapping[str, ListedTool]]
    #: the prelude's namespace tools, one per server that listed
    namespaces: tuple[dict[str, Any], ...]
    #: ``mcp_list_tools`` items this turn reports (first use in the chain, or a failed listing)
    listings: tuple[dict[str, Any], ...]
    #: ``mcp_approval_request`` items the request approved: run before generating
    approved: tuple[dict[str, Any], ...] = ()
    #: the request's ``web_search`` tool, when the gateway runs it
    web: WebTool | None = None
    #: the request's ``file_search`` tool (``gateway.tools.file_search``)
    files: FileTool | None = None
    #: the request's ``code_interpreter`` tool and its container (``gateway.tools.code_interpreter``)
    code: CodeTool | None = None

    @property
    def active(self) -> bool:
        """The turn has tools the gateway runs (a tool loop between engine passes)."""
        return bool(self.servers) or self.web is not None or self.files is not None or self.code is not None

    def decide(self, label: str, name: str) -> Decision:
        """Whether the model's call of ``name`` on server ``label`` runs now or asks first."""
        tool = self.tools.get(label, {}).get(name)
        return self.servers[label].approval.decide(name, tool.annotations if tool is not None else None)


NO_HOSTED = HostedTurn({}, {}, (), ())


def _allowed(tool: ListedTool, allowed: ToolFilter | None) -> bool:
    return allowed is None or allowed.matches(tool.name, tool.annotations)


def _allowed_filter(raw: Any) -> ToolFilter | None:
    if raw is None:
        return None
    if isinstance(raw, list):
        return ToolFilter(frozenset(raw))
    return ToolFilter(frozenset(raw.tool_names or ()), bool(raw.read_only))


def namespace_tool(server: McpServer, tools: Sequence[ListedTool]) -> dict[str, Any]:
    """The server's tools as the model sees them: a namespace of (non-strict) functions."""
    return {
        "type": "namespace",
        "name": server.label,
        "description": server.description,
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description or "",
                "parameters": t.input_schema or {"type": "object", "properties": {}},
                "strict": False,
            }
            for t in tools
        ],
    }


def listing_item(label: str, tools: Sequence[ListedTool], error: str | None = None) -> dict[str, Any]:
    return {
        "id": new_id("mcpl"),
        "type": "mcp_list_tools",
        "server_label": label,
        "tools": [t.wire() for t in tools],
        "error": error,
    }


class HostedTools:
    """The gateway's MCP side: the operator's servers and allow-lists, the client, the catalog."""

    def __init__(self, settings: Settings, metrics: Metrics, client: McpClient | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        #: all one MCP operation may read: room for an output (twice: text and structured
        #: content) well past the cut the model sees, so a long output is cut, not refused
        read_cap = max(8 * 1024 * 1024, 4 * settings.tool_output_bytes)
        policy = OutboundPolicy(allow_networks=tuple(settings.outbound_allow_networks), max_response_bytes=read_cap)
        self.client = client or McpClient(
            mcp_client_factory(policy),
            list_timeout=settings.mcp_list_timeout_s,
            call_timeout=settings.mcp_call_timeout_s,
            max_output_bytes=settings.tool_output_bytes,
            max_response_bytes=read_cap,
        )
        #: operator servers: no address check (the operator chose them), same bounds otherwise
        self.trusted_client = McpClient(
            mcp_client_factory(OutboundPolicy(allow_networks=("0.0.0.0/0", "::/0"))),
            list_timeout=settings.mcp_list_timeout_s,
            call_timeout=settings.mcp_call_timeout_s,
            max_output_bytes=settings.tool_output_bytes,
            max_response_bytes=read_cap,
        )
        self.catalog = ToolCatalog(self.client, ttl=settings.mcp_tools_ttl_s)
        self.trusted_catalog = ToolCatalog(self.trusted_client, ttl=settings.mcp_tools_ttl_s)

    # -- checks (no I/O) -------------------------------------------------------------------------

    def servers(
        self, tools: Sequence[tuple[int, McpTool]], tenant: str | None, taken: Container[str] = ()
    ) -> tuple[McpServer, ...]:
        """Each ``mcp`` tool (with its index in ``tools``) checked against the operator's settings.
        ``taken``: the names of the request's other tools (a label names a namespace the model
        sees: it may not merge with a client's namespace or shadow a function)."""
        out: list[McpServer] = []
        seen: set[str] = set()
        for i, tool in tools:
            if tool.server_label in seen or tool.server_label in taken or tool.server_label in RESERVED_LABELS:
                why = "Duplicate" if tool.server_label in seen else "Reserved or already used"
                raise bad_request(
                    f"{why} MCP server_label '{tool.server_label}': it names the server's tools for the model.",
                    code="invalid_value",
                    param=f"tools[{i}].server_label",
                )
            seen.add(tool.server_label)
            out.append(self._server(i, tool, tenant))
        return tuple(out)

    def _server(self, i: int, tool: McpTool, tenant: str | None) -> McpServer:
        if tool.connector_id is not None:
            raise ApiError(
                400,
                "MCP connectors are not supported by this gateway; name a server_url.",
                code="unsupported_parameter",
                param=f"tools[{i}].connector_id",
            )
        configured = self.settings.mcp_servers.get(tool.server_label)
        if configured is not None and configured.tenants is not None and tenant not in configured.tenants:
            configured = None  # another tenant's server: as if it did not exist
        headers: dict[str, str] = {}
        if configured is not None:
            if tool.server_url is not None and tool.server_url != configured.url:
                raise bad_request(
                    f"server_label '{tool.server_label}' names a server configured on this gateway; "
                    "omit server_url to use it.",
                    code="invalid_value",
                    param=f"tools[{i}].server_url",
                )
            url, metric_label = configured.url, tool.server_label
        elif tool.server_url is None:
            raise bad_request(
                f"Missing 'server_url' for MCP server '{tool.server_label}': it is not a server "
                "configured on this gateway.",
                code="missing_required_parameter",
                param=f"tools[{i}].server_url",
            )
        else:
            url, metric_label = self._check_url(i, tool.server_url, tenant), REQUEST_SERVER
        headers.update(tool.headers or {})
        if tool.authorization is not None:
            headers["Authorization"] = f"Bearer {tool.authorization}"
        if configured is not None:
            headers.update(configured.headers)  # the operator's credentials win
        description = tool.server_description or (configured.description if configured is not None else None) or ""
        return McpServer(
            label=tool.server_label,
            endpoint=McpEndpoint(label=tool.server_label, url=url, headers=headers),
            description=description,
            allowed=_allowed_filter(tool.allowed_tools),
            approval=approval_policy(tool.require_approval),
            metric_label=metric_label,
        )

    def _check_url(self, i: int, url: str, tenant: str | None) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise bad_request(
                "Invalid 'server_url': expected an http or https URL.",
                code="invalid_value",
                param=f"tools[{i}].server_url",
            )
        if parts.username is not None or parts.password is not None:
            raise bad_request(
                "Invalid 'server_url': credentials in the URL are not accepted; use 'headers' or 'authorization'.",
                code="invalid_value",
                param=f"tools[{i}].server_url",
            )
        allowed = self.settings.mcp_allowed_urls
        prefixes = allowed.get(tenant or "", allowed.get("*", []))
        if not any(url.startswith(p) for p in prefixes):
            raise ApiError(
                400,
                "This server_url is not allowed for your API key on this gateway.",
                code="invalid_value",
                param=f"tools[{i}].server_url",
            )
        return url

    # -- listing (I/O) ---------------------------------------------------------------------------

    def _catalog(self, server: McpServer) -> ToolCatalog:
        return self.trusted_catalog if server.metric_label != REQUEST_SERVER else self.catalog

    def _client(self, server: McpServer) -> McpClient:
        return self.trusted_client if server.metric_label != REQUEST_SERVER else self.client

    async def prepare(
        self,
        servers: Sequence[McpServer],
        tenant: str | None,
        listed_before: Container[str],
        approved: Sequence[dict[str, Any]] = (),
    ) -> HostedTurn:
        """List every server's tools at once (each bounded by ``mcp_list_timeout_s``)."""
        if not servers:
            return NO_HOSTED
        results = await asyncio.gather(*(self._list(s, tenant) for s in servers))
        tools: dict[str, dict[str, ListedTool]] = {}
        namespaces: list[dict[str, Any]] = []
        listings: list[dict[str, Any]] = []
        for server, (listed, error) in zip(servers, results, strict=True):
            if error is not None:
                listings.append(listing_item(server.label, (), error))
                continue
            kept = [t for t in listed if _allowed(t, server.allowed) and _NAME_OK.match(t.name)]
            tools[server.label] = {t.name: t for t in kept}
            if kept:
                namespaces.append(namespace_tool(server, kept))
            if server.label not in listed_before:
                listings.append(listing_item(server.label, kept))
        return HostedTurn(
            servers={s.label: s for s in servers},
            tools=tools,
            namespaces=tuple(namespaces),
            listings=tuple(listings),
            approved=tuple(approved),
        )

    async def _list(self, server: McpServer, tenant: str | None) -> tuple[Sequence[ListedTool], str | None]:
        t0 = time.perf_counter()
        try:
            listed = await self._catalog(server).tools(tenant, server.endpoint)
        except McpError as exc:
            self.metrics.hosted_listings.labels("mcp", server.metric_label, "error").inc()
            log.info("MCP server %s could not list its tools: %s", server.metric_label, exc)
            return (), f"Error retrieving tool list from MCP server '{server.label}': {exc}"
        self.metrics.hosted_listings.labels("mcp", server.metric_label, "ok").inc()
        self.metrics.hosted_list_seconds.labels("mcp", server.metric_label).observe(time.perf_counter() - t0)
        return listed, None

    # -- calls (I/O) -----------------------------------------------------------------------------

    async def call(self, server: McpServer, name: str, arguments: str) -> ToolResult:
        """Run one call; every fault is the result's ``error`` (only cancellation propagates)."""
        try:
            args = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return ToolResult(
                output=None, error="The tool call's arguments are not a JSON object.", output_bytes=0, elapsed=0.0
            )
        return await self._client(server).call_tool(server.endpoint, name, args)

    def observe(self, server: McpServer, result: ToolResult, seconds: float) -> None:
        """Count one finished call (metrics: per tool type and server label)."""
        _observe(self.metrics, server, result, seconds)


def error_object(result: ToolResult) -> dict[str, Any] | None:
    """A failed call's ``mcp_call.error`` in the SDK's ``McpToolCallError`` shape: the tool's own
    error (``isError``) as ``mcp_tool_execution_error`` with its text, a server that could not be
    reached or answered with an HTTP error as ``http_error``, anything else ``mcp_protocol_error``."""
    if result.error is None:
        return None
    kind = getattr(result, "error_kind", "tool")
    if kind == "tool":
        return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": result.error}]}
    if kind == "http":
        return {"type": "http_error", "code": int(getattr(result, "http_status", 0) or 0), "message": result.error}
    return {"type": "mcp_protocol_error", "code": -32603, "message": result.error}


def _observe(metrics: Metrics, server: McpServer, result: ToolResult, seconds: float) -> None:
    outcome = "error" if result.error is not None else "ok"
    metrics.hosted_calls.labels("mcp", server.metric_label, outcome).inc()
    metrics.hosted_call_seconds.labels("mcp", server.metric_label).observe(seconds)
    metrics.hosted_output_bytes.labels("mcp", server.metric_label).inc(result.output_bytes)


def approvals_to_run(
    new_items: Sequence[Mapping[str, Any]], lookup: Mapping[str, Mapping[str, Any]]
) -> list[tuple[int, Mapping[str, Any], bool]]:
    """The request's ``mcp_approval_response`` items not yet answered by an ``mcp_call``: (index,
    the approval request it answers, approve). ``lookup`` finds earlier items by id (the parent's
    context); requests among the new items are found there too. Raises ``ApiError`` (naming the
    item) for a response to no request."""
    answered = {it.get("approval_request_id") for it in new_items if it.get("type") == "mcp_call"}
    local = {it.get("id"): it for it in new_items if it.get("type") == "mcp_approval_request"}
    out: list[tuple[int, Mapping[str, Any], bool]] = []
    for i, item in enumerate(new_items):
        if item.get("type") != "mcp_approval_response":
            continue
        rid = item.get("approval_request_id")
        if rid in answered:
            continue
        request = local.get(rid) if isinstance(rid, str) else None
        if request is None and isinstance(rid, str):
            request = lookup.get(rid)
        if request is None or request.get("type") != "mcp_approval_request":
            raise bad_request(
                f"No MCP approval request found with id '{str(rid)[:128]}'.",
                code="invalid_value",
                param=f"input[{i}].approval_request_id",
            )
        out.append((i, request, item.get("approve") is True))
    return out
