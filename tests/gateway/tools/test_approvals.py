"""``require_approval`` as a table (``gateway.tools.approvals``): every row, through the wire model
a request's value is validated by, so the policy is what a client's JSON means."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tools.approvals import Decision, approval_policy
from gateway.wire.tools import McpTool

RO = {"readOnlyHint": True}


def decide(require_approval: Any, name: str, annotations: dict[str, Any] | None = None) -> Decision:
    tool = McpTool.model_validate(
        {"type": "mcp", "server_label": "s", "server_url": "https://x/", "require_approval": require_approval}
    )
    return approval_policy(tool.require_approval).decide(name, annotations)


A, R = Decision.APPROVE, Decision.RUN


@pytest.mark.parametrize(
    ("policy", "name", "annotations", "expected"),
    [
        (None, "t", None, A),  # absent: ask first, as OpenAI does
        ("always", "t", RO, A),
        ("never", "t", None, R),
        ({"always": {"tool_names": ["t"]}}, "t", None, A),
        ({"always": {"tool_names": ["t"]}}, "u", None, R),  # only "always" named: the rest runs
        ({"never": {"tool_names": ["t"]}}, "t", None, R),
        ({"never": {"tool_names": ["t"]}}, "u", None, A),  # only "never" named: the rest asks
        ({"never": {"read_only": True}}, "u", RO, R),  # the server's readOnlyHint
        ({"never": {"read_only": True}}, "u", {"readOnlyHint": False}, A),
        ({"always": {"tool_names": ["t"]}, "never": {"tool_names": ["t"]}}, "t", None, A),  # always wins
        ({"always": {"tool_names": ["t"]}, "never": {"tool_names": ["u"]}}, "u", None, R),
        ({"always": {"tool_names": ["t"]}, "never": {"tool_names": ["u"]}}, "v", None, A),
        ({}, "t", None, A),
    ],
)
def test_every_row(policy: Any, name: str, annotations: dict[str, Any] | None, expected: Decision) -> None:
    assert decide(policy, name, annotations) == expected
