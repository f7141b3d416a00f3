"""Tool definitions as clients send them, and how the Response echoes them.

Function, custom (Codex's freeform ``apply_patch`` with a lark grammar) and namespace tools are
rendered for the model. ``mcp`` tools name a remote MCP server the gateway itself calls
(``gateway.tools``): its tools are listed and rendered as a namespace. Other hosted tools
(``web_search``, ``tool_search``, ...) are run by OpenAI, not by us: Codex sends
``web_search`` and ``tool_search`` in every frame, so by default they are stripped (accepted,
not shown to the model, not echoed); ``hosted_tools="reject"`` answers them with
``400 unsupported_value`` instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(_Lenient):
    type: Literal["custom"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    format: dict[str, Any] | None = None


def _nested_tag(v: Any) -> str | None:
    # dicts when validating, model instances when serializing (canonical_tool's model_dump)
    return v.get("type") if isinstance(v, dict) else getattr(v, "type", None)


class NamespaceTool(_Lenient):
    type: Literal["namespace"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    tools: list[
        Annotated[
            Annotated[FunctionTool, Tag("function")] | Annotated[CustomTool, Tag("custom")],
            Discriminator(_nested_tag),
        ]
    ]


class HostedTool(_Lenient):
    type: str


class McpToolFilter(BaseModel):
    """``allowed_tools`` / ``require_approval.always|never`` as an object: tools by name, or those the
    server annotates ``readOnlyHint`` (``read_only``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    tool_names: list[Annotated[str, Field(max_length=256)]] | None = Field(default=None, max_length=1024)
    read_only: bool | None = None


class McpApprovalFilter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(_Lenient):
    """A remote MCP server the gateway calls for the model (``gateway.tools``). ``headers`` and
    ``authorization`` are credentials: kept for the turn only, never stored, logged or echoed."""

    type: Literal["mcp"]
    server_label: str = Field(pattern=TOOL_NAME)
    server_url: str | None = Field(default=None, max_length=2048)
    connector_id: str | None = None
    server_description: str | None = Field(default=None, max_length=8192)
    headers: dict[str, Annotated[str, Field(max_length=8192)]] | None = Field(default=None, max_length=64)
    authorization: str | None = Field(default=None, max_length=8192)
    allowed_tools: list[Annotated[str, Field(max_length=256)]] | McpToolFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None

    @field_validator("allowed_tools", mode="before")
    @classmethod
    def _allowed_tools(cls, v: Any) -> Any:
        """One error naming the field (not each union member) for a value of neither shape."""
        if v is None or isinstance(v, list):
            return v
        if isinstance(v, dict):
            return McpToolFilter.model_validate(v)
        raise ValueError("expected a list of tool names or an object with 'tool_names' and/or 'read_only'")

    @field_validator("require_approval", mode="before")
    @classmethod
    def _require_approval(cls, v: Any) -> Any:
        if v is None or v in ("always", "never"):
            return v
        if isinstance(v, dict):
            return McpApprovalFilter.model_validate(v)
        raise ValueError("expected 'always', 'never', or an object with 'always' and/or 'never' filters")


#: the ``web_search`` tool's type and its dated aliases (``gateway.tools.web`` runs them when the
#: operator configured a backend; else they are stripped like the other hosted tools)
WEB_SEARCH_TYPES = frozenset(
    {"web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"}
)


#: tool types the gateway runs itself: they are not among the model's tools (it sees MCP servers'
#: tools, the browser, ``file_search.msearch`` and ``python`` instead)
GATEWAY_RUN_TYPES = WEB_SEARCH_TYPES | {"mcp", "file_search", "code_interpreter"}


class WebSearchFilters(_Lenient):
    """``filters``: the domains results (and opened pages) must be on; subdomains included."""

    allowed_domains: list[Annotated[str, Field(max_length=253)]] | None = Field(default=None, max_length=100)


class WebSearchLocation(_Lenient):
    """``user_location`` (``approximate``): passed to backends that take a country or language."""

    type: Literal["approximate"] | None = None
    city: str | None = Field(default=None, max_length=256)
    country: str | None = Field(default=None, max_length=2)
    region: str | None = Field(default=None, max_length=256)
    timezone: str | None = Field(default=None, max_length=64)


class WebSearchTool(_Lenient):
    """The ``web_search`` tool when the gateway runs it: checked only then (when it is stripped, any
    shape is accepted, as before: Codex sends it in every frame)."""

    type: Literal["web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"]
    filters: WebSearchFilters | None = None
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: WebSearchLocation | None = None
    #: false: no live fetch wanted (OpenAI's cache-only mode); the gateway has no cache, so searches
    #: still run and pages are opened only when true or absent (``gateway.tools.web``)
    external_web_access: bool | None = None
    #: ``web_search_preview``: ``text`` and/or ``image`` results; the gateway's backends give text
    search_content_types: list[Literal["text", "image"]] | None = Field(default=None, max_length=2)

    def echo(self) -> dict[str, Any]:
        """The tool as the Response echoes it: every field of the SDK's type for its ``type``
        (``WebSearchTool`` or ``WebSearchPreviewTool``), absent ones null."""
        d = self.model_dump(exclude_none=True)
        preview = self.type.startswith("web_search_preview")
        names = _PREVIEW_ECHO_FIELDS if preview else _WEB_SEARCH_ECHO_FIELDS
        out = {name: d.get(name) for name in names}
        if self.user_location is not None:
            loc = self.user_location.model_dump()
            loc["type"] = loc.get("type") or "approximate"
            out["user_location"] = loc
        return out


_WEB_SEARCH_ECHO_FIELDS = (
    "type",
    "external_web_access",
    "filters",
    "search_context_size",
    "user_location",
)
_PREVIEW_ECHO_FIELDS = ("type", "search_content_types", "search_context_size", "user_location")


class FileSearchHybrid(_Lenient):
    embedding_weight: float = Field(ge=0)
    text_weight: float = Field(ge=0)


class FileSearchRanking(_Lenient):
    """``ranking_options``: the ranker (``auto`` and the dated one are the same hybrid ranking here),
    a score threshold, and the weights of the vector and keyword sides."""

    ranker: Literal["auto", "default-2024-11-15"] | None = None
    score_threshold: float | None = Field(default=None, ge=0, le=1)
    hybrid_search: FileSearchHybrid | None = None


class FileSearchTool(_Lenient):
    """The ``file_search`` tool (``gateway.tools.file_search`` runs it over the tenant's vector stores)."""

    type: Literal["file_search"]
    vector_store_ids: list[Annotated[str, Field(max_length=128)]] = Field(min_length=1, max_length=16)
    max_num_results: int | None = Field(default=None, ge=1, le=50)
    #: OpenAI's attribute filter (checked by ``cache.files.index.parse_filter``)
    filters: dict[str, Any] | None = None
    ranking_options: FileSearchRanking | None = None

    def echo(self) -> dict[str, Any]:
        """Every field of the SDK's ``FileSearchTool``, absent ones null."""
        d = self.model_dump(exclude_none=True)
        return {
            name: d.get(name) for name in ("type", "vector_store_ids", "filters", "max_num_results", "ranking_options")
        }


class CodeInterpreterNetwork(_Lenient):
    """``container.network_policy``: the sandbox has no network, so only ``disabled`` is served."""

    type: Literal["disabled"]


class CodeInterpreterAuto(_Lenient):
    """``container: {"type": "auto", ...}``: a container made for the response (reused along its
    chain while it lives), with the tenant's Files API files copied into ``/mnt/data``."""

    type: Literal["auto"]
    file_ids: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=50)
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None
    network_policy: CodeInterpreterNetwork | None = None


class CodeInterpreterTool(_Lenient):
    """The ``code_interpreter`` tool (``gateway.tools.code_interpreter`` runs it in the tenant's
    containers): a container id of the tenant's, or ``auto``."""

    type: Literal["code_interpreter"]
    container: Annotated[str, Field(min_length=1, max_length=128)] | CodeInterpreterAuto

    def echo(self) -> dict[str, Any]:
        """The tool as sent: every field of the SDK's ``CodeInterpreter`` (``container`` an id or the
        auto object), absent ones null."""
        container: Any = self.container
        if not isinstance(container, str):
            d = container.model_dump(exclude_none=True)
            container = {name: d.get(name) for name in ("type", "file_ids", "memory_limit", "network_policy")}
        allowed = (self.model_extra or {}).get("allowed_callers")
        return {"type": "code_interpreter", "container": container, "allowed_callers": allowed}


HOSTED_TOOL_TYPES = frozenset(
    {
        "file_search",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "computer",
        "computer_use_preview",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)


class _UnknownTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function", "custom", "namespace"]


def _tool_tag(v: Any) -> str:
    # dicts when validating, model instances when a request is serialized (as _nested_tag)
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    if not isinstance(t, str):  # a list or object is unhashable: the set lookup below would raise, not refuse
        return "<unknown>"
    if t in ("function", "custom", "namespace", "mcp"):
        return t
    if t in HOSTED_TOOL_TYPES:
        return "<hosted>"
    return "<unknown>"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[McpTool, Tag("mcp")]
    | Annotated[HostedTool, Tag("<hosted>")]
    | Annotated[_UnknownTool, Tag("<unknown>")],
    Discriminator(_tool_tag),
]


def canonical_tool(tool: BaseModel) -> dict[str, Any]:
    """The tool as echoed in the Response: functions are strict unless told otherwise."""
    if isinstance(tool, McpTool):  # credentials are never echoed (OpenAI's echo omits them too)
        return mcp_echo(tool)
    d = tool.model_dump(exclude_none=True)
    if d["type"] == "function":
        d.setdefault("strict", True)
        d.setdefault("parameters", None)
        d.setdefault("description", None)
    elif d["type"] == "namespace":
        for sub in d["tools"]:
            if sub["type"] == "function":
                sub.setdefault("strict", True)
    return d


#: the fields of OpenAI's echoed ``mcp`` tool (the SDK's ``Mcp``): absent ones are echoed as null
MCP_ECHO_FIELDS = (
    "server_label",
    "type",
    "allowed_callers",
    "allowed_tools",
    "authorization",
    "connector_id",
    "defer_loading",
    "headers",
    "require_approval",
    "server_description",
    "server_url",
    "tunnel_id",
)


def mcp_echo(tool: McpTool) -> dict[str, Any]:
    """The MCP tool as the Response echoes it: every field but the credentials (null)."""
    d = tool.model_dump(exclude_none=True, exclude={"headers", "authorization"})
    for name in MCP_ECHO_FIELDS:
        d.setdefault(name, None)
    return d


def tool_names(tools: tuple[dict[str, Any], ...]) -> dict[tuple[str | None, str], str]:
    """(namespace, name) -> tool type, for validating tool_choice and parsed calls."""
    out: dict[tuple[str | None, str], str] = {}
    for t in tools:
        if t["type"] in GATEWAY_RUN_TYPES:  # the gateway's tools (``gateway.tools``)
            continue
        if t["type"] == "namespace":
            for sub in t["tools"]:
                out[(t["name"], sub["name"])] = sub["type"]
        else:
            out[(None, t["name"])] = t["type"]
    return out
