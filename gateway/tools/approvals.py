"""Which MCP calls need the user's approval: ``require_approval`` as a table, no I/O.

OpenAI's rules, read as data. A tool matches a filter (``{"tool_names": [...], "read_only": bool}``)
when it is named there, or when ``read_only`` is true and the server annotates the tool
``readOnlyHint``. Then:

    require_approval            the tool matches ``always``   matches ``never``   neither
    ------------------------    -------------------------     ---------------     -------
    absent / "always"           approve                       approve             approve
    "never"                     run                           run                 run
    {"always": F}               approve                       -                   run
    {"never": F}                -                             run                 approve
    {"always": A, "never": N}   approve (always wins)         run                 approve

``approve``: the call ends the response as an ``mcp_approval_request``; the client's
``mcp_approval_response`` runs it (or refuses it) in the next request. A call needs approval by
default, as OpenAI's does: a tool the user never vetted does not run unasked.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec


class Decision(StrEnum):
    RUN = "run"
    APPROVE = "approve"


class ToolFilter(msgspec.Struct, frozen=True):
    names: frozenset[str] = frozenset()
    read_only: bool = False

    def matches(self, name: str, annotations: Mapping[str, Any] | None) -> bool:
        if name in self.names:
            return True
        return self.read_only and bool((annotations or {}).get("readOnlyHint"))


class ApprovalPolicy(msgspec.Struct, frozen=True):
    """``require_approval`` of one server. ``default`` is the decision for a tool no filter names."""

    default: Decision = Decision.APPROVE
    always: ToolFilter | None = None
    never: ToolFilter | None = None

    def decide(self, name: str, annotations: Mapping[str, Any] | None = None) -> Decision:
        if self.always is not None and self.always.matches(name, annotations):
            return Decision.APPROVE
        if self.never is not None and self.never.matches(name, annotations):
            return Decision.RUN
        return self.default


def _filter(raw: Any) -> ToolFilter | None:
    if raw is None:
        return None
    names = getattr(raw, "tool_names", None) or ()
    return ToolFilter(frozenset(names), bool(getattr(raw, "read_only", False)))


def approval_policy(require_approval: Any) -> ApprovalPolicy:
    """The policy of a validated ``require_approval`` (``gateway.wire.tools.McpTool``): absent or
    ``"always"``, ``"never"``, or an object with ``always`` and/or ``never`` filters."""
    if require_approval is None or require_approval == "always":
        return ApprovalPolicy(Decision.APPROVE)
    if require_approval == "never":
        return ApprovalPolicy(Decision.RUN)
    always = _filter(getattr(require_approval, "always", None))
    never = _filter(getattr(require_approval, "never", None))
    # only "always" named: what it does not name runs; otherwise what no filter names asks first
    default = Decision.RUN if always is not None and never is None else Decision.APPROVE
    return ApprovalPolicy(default, always, never)
