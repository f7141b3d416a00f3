"""An external classifier over HTTP: an organisation's own moderation service, given only new items.

One POST per turn carries the text of the turn's new items (never the history, never items with no
text); the answer maps to verdicts. Two wire formats:

``respgate`` (default)::

    POST {"items": [{"index": 0, "id": "msg_..", "type": "message", "role": "user", "text": "..."}]}
    200  {"results": [{"index": 0, "action": "flag", "category": "harassment", "score": 0.91}]}

    ``results`` may list only the items that are not allowed; ``action`` is allow / flag / block.

``openai`` (the OpenAI moderations shape, which many self-hosted moderation servers speak)::

    POST {"input": ["...", "..."]}          (plus "model" when configured)
    200  {"results": [{"flagged": true, "categories": {...}, "category_scores": {...}}, ...]}

    positional; a flagged result becomes a ``flag`` verdict in its highest-scoring true category.

When the service cannot answer (connection refused, timeout, non-2xx, malformed body) the
configured failure mode decides. ``open`` (default): the turn goes on, with a ``flag`` verdict in
category ``classifier_unavailable`` so the unchecked conversation reaches the review stream, and a
warning is logged (without content). ``closed``: ``ClassifierUnavailable`` is raised and the
pipeline answers 503 ``classifier_unavailable`` — a retryable error, because the request itself
was not found to be bad.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import httpx

from security.classifiers import SEVERITY, ClassifierUnavailable, ItemText, Verdict

log = logging.getLogger(__name__)


class ExternalClassifier:
    source = "external"
    #: waits on the network: the composite runs it concurrently with the CPU-only classifiers
    io = True

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        fail_mode: Literal["open", "closed"] = "open",
        wire: Literal["respgate", "openai"] = "respgate",
        api_key: str | None = None,
        model: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self.fail_mode = fail_mode
        self.wire = wire
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.AsyncClient(timeout=timeout_s, headers=headers)
        #: calls made, calls that failed, items sent (for metrics and tests)
        self.calls = 0
        self.failures = 0
        self.items_sent = 0

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]:
        batch = [it for it in items if it.text]
        if not batch:
            return []
        self.calls += 1
        self.items_sent += len(batch)
        try:
            resp = await self.client.post(self.url, json=self._body(batch))
            resp.raise_for_status()
            return self._verdicts(batch, resp.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            self.failures += 1
            # the exception's text names the URL or status, never the items' content
            log.warning(
                "external classifier %s failed (%s: %s); fail-%s",
                self.url,
                type(exc).__name__,
                str(exc)[:200],
                self.fail_mode,
            )
            if self.fail_mode == "closed":
                raise ClassifierUnavailable("the external content classifier is unavailable") from None
            return [
                Verdict(
                    "flag",
                    "classifier_unavailable",
                    0.0,
                    None,
                    None,
                    type(exc).__name__,
                    self.source,
                    "unclassified content",
                    "external classifier unavailable; turn not checked",
                )
            ]

    def _body(self, batch: Sequence[ItemText]) -> dict[str, Any]:
        if self.wire == "openai":
            body: dict[str, Any] = {"input": [it.text for it in batch]}
            if self.model:
                body["model"] = self.model
            return body
        return {
            "items": [
                {"index": it.index, "id": it.item_id, "type": it.type, "role": it.role, "text": it.text} for it in batch
            ]
        }

    def _verdicts(self, batch: Sequence[ItemText], body: Any) -> list[Verdict]:
        results = body["results"]
        if not isinstance(results, list):
            raise ValueError("'results' is not a list")
        out: list[Verdict] = []
        if self.wire == "openai":
            if len(results) != len(batch):
                raise ValueError(f"{len(results)} results for {len(batch)} inputs")
            for it, r in zip(batch, results):
                if not r.get("flagged"):
                    continue
                cats = [c for c, on in (r.get("categories") or {}).items() if on]
                scores = r.get("category_scores") or {}
                cat = max(cats, key=lambda c: float(scores.get(c, 0.0)), default="flagged")
                out.append(
                    Verdict(
                        "flag",
                        f"moderation:{cat}",
                        float(scores.get(cat, 1.0)),
                        it.index,
                        it.item_id,
                        cat,
                        self.source,
                        f"content the moderation service flagged ({cat})",
                    )
                )
            return out
        by_index = {it.index: it for it in batch}
        for r in results:
            action = r.get("action", "allow")
            if action not in SEVERITY:
                raise ValueError(f"unknown action {action!r}")
            index = r.get("index")
            if action == "allow":
                continue
            sent = by_index.get(index) if index is not None else None
            if index is not None and sent is None:
                raise ValueError(f"result for an item that was not sent (index {index})")
            cat = str(r.get("category") or "external")
            out.append(
                Verdict(
                    action,
                    f"moderation:{cat}",
                    float(r.get("score", 1.0)),
                    index,
                    sent.item_id if sent else None,
                    r.get("rule"),
                    self.source,
                    f"content the moderation service classified as '{cat}'",
                )
            )
        return out

    async def close(self) -> None:
        await self.client.aclose()
