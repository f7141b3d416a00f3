"""Hosted tools the model calls through a namespace the gateway gives it — ``browser`` for
``web_search``, ``file_search`` and ``python`` for ``code_interpreter`` — as
one table, so that the response's events (``gateway.turn.events``) and the tool loop
(``gateway.turn.tool_loop``) treat them all alike instead of a branch per tool.

Each such call is an output item of its own type (``web_search_call`` ...) that opens when the
model starts the call (``in_progress``, its arguments not streamed), runs between two engine passes
(its running event: ``searching``), and ends ``completed`` (with its event) or ``failed`` (the API
has no event for that: ``output_item.done`` says it). A kind whose call is code (``python``) streams
it as ``response.<item_type>_code.delta`` events and closes it with ``..._code.done`` before it runs
(OpenAI's ``code_interpreter_call`` events). What the model reads back is a
``function_call_output`` in the tool's namespace, appended at the token tip. MCP calls are not in
this table: their items, approvals and listings are their own (``gateway.tools.hosted``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from inference.browser_tool import BROWSER
from inference.item_types import ItemType
from inference.python_tool import PYTHON

__all__ = [
    "CALL_KINDS",
    "CODE_INTERPRETER",
    "FILE_SEARCH",
    "FILE_SEARCH_NAMESPACE",
    "WEB_SEARCH",
    "CallKind",
    "CallResult",
    "CallRunner",
    "kind_of_item",
]


@dataclass(frozen=True, slots=True)
class CallKind:
    """How one hosted tool's calls look on the wire."""

    #: the namespace the model calls (harmony recipient ``browser.search``, chat template ``browser__search``)
    namespace: str
    item_type: ItemType
    #: the item id's prefix
    id_prefix: str
    #: the events: ``response.<item_type>.<in_progress|running|completed>``
    running: str
    #: the item's own fields while the call is written (the function the model chose, nothing run)
    pending: Callable[[str], dict[str, Any]]
    #: the call is code: streamed (``response.<item_type>_code.delta``/``done``) and kept in ``code``
    code: bool = False

    def event(self, phase: str) -> str:
        return f"response.{self.item_type.value}.{phase}"

    def code_event(self, phase: str) -> str:
        return f"response.{self.item_type.value}_code.{phase}"


class CallResult(NamedTuple):
    """A call that ran: what the model reads, the item's fields it set, whether it failed."""

    text: str
    fields: dict[str, Any]
    failed: bool


class CallRunner(Protocol):
    """Runs one response's calls of one kind."""

    kind: CallKind

    async def run(self, function: str, arguments: str) -> CallResult: ...

    def not_run(self, function: str, text: str) -> CallResult:
        """A call refused before it ran (past ``max_tool_calls``): ``text`` for the model."""
        ...


#: the browser function the model called -> its ``web_search_call`` action type
_ACTION_OF = {"search": "search", "open": "open_page", "find": "find_in_page"}


def pending_action(function: str) -> dict[str, Any]:
    """The action a browser call announces before its arguments are read (the SDK's shapes: a
    find's ``pattern`` and ``url`` are required strings, filled once it ran)."""
    kind = _ACTION_OF.get(function, "search")
    if kind == "find_in_page":
        return {"type": kind, "pattern": "", "url": ""}
    if kind == "open_page":
        return {"type": kind, "url": None}
    return {"type": kind, "query": None, "queries": None, "sources": None}


WEB_SEARCH = CallKind(
    namespace=BROWSER,
    item_type=ItemType.WEB_SEARCH_CALL,
    id_prefix="ws",
    running="searching",
    pending=lambda function: {"action": pending_action(function)},
)

#: the namespace the model searches the request's vector stores through
FILE_SEARCH_NAMESPACE = "file_search"

FILE_SEARCH = CallKind(
    namespace=FILE_SEARCH_NAMESPACE,
    item_type=ItemType.FILE_SEARCH_CALL,
    id_prefix="fs",
    running="searching",
    pending=lambda function: {"queries": [], "results": None},
)

CODE_INTERPRETER = CallKind(
    namespace=PYTHON,
    item_type=ItemType.CODE_INTERPRETER_CALL,
    id_prefix="ci",
    running="interpreting",
    # the container is the response's (``ResponseEvents`` adds its id); outputs once it ran
    pending=lambda function: {"code": "", "outputs": None},
    code=True,
)

#: every such kind, by the namespace the model calls
CALL_KINDS: dict[str, CallKind] = {k.namespace: k for k in (WEB_SEARCH, FILE_SEARCH, CODE_INTERPRETER)}
_BY_ITEM: dict[str, CallKind] = {k.item_type.value: k for k in CALL_KINDS.values()}


def kind_of_item(item_type: str) -> CallKind | None:
    """The kind whose item ``item_type`` is, if any."""
    return _BY_ITEM.get(item_type)
