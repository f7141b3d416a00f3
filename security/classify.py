"""Classifier hook: runs on a turn's NEW items only; verdicts of the parent are inherited.

The real classifiers (and the asynchronous flag reporting) arrive with the security issue; the
pipeline already calls this protocol with exactly the new items, so those classifiers inherit the
O(new input) property instead of having to retrofit it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Literal["allow", "flag", "block"] = "allow"
    category: str | None = None
    item_id: str | None = None


class Classifier(Protocol):
    async def classify(self, items: Sequence[dict[str, Any]]) -> list[Verdict]: ...


class AllowAll:
    """No classification configured: every item is allowed (still counted by the pipeline)."""

    async def classify(self, items: Sequence[dict[str, Any]]) -> list[Verdict]:
        return []
