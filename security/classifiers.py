"""Classifier protocol: each NEW item of a turn is classified once; verdicts of the parent are inherited.

The gateway hands classifiers exactly the items a turn adds (never the history), already reduced
to the text a classifier may look at (:class:`ItemText`; which text of which item is the
gateway's ``gateway/turn/classify.py``, driven by its kinds map): that is what makes the
classifier work of a chained conversation equal the sum of its new items, and what the byte
counter measures. Classifiers see text and where it came from (a message role, or a tool), never
item shapes. A verdict never carries a matched value: ``hint`` is written to be safe to show a
client and to store in a review queue (a token type and length, a masked excerpt).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

Action = Literal["allow", "flag", "block"]
SEVERITY: dict[str, int] = {"allow": 0, "flag": 1, "block": 2}


@dataclass(frozen=True, slots=True)
class ItemText:
    """The classifiable text of one new item, with where it sits in the request."""

    index: int  # position in the request's ``input`` list
    item_id: str | None
    type: str  # item type (message, function_call_output, ...)
    role: str | None  # message role; None for other items
    text: str
    #: text that came from a tool, not from the user: where prompt injection arrives
    tool_output: bool = False
    #: UTF-8 size of ``text`` (what the byte counter adds up), computed once
    nbytes: int = -1

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            object.__setattr__(self, "nbytes", len(self.text.encode("utf-8", "surrogatepass")))


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action = "allow"
    #: what was found, fine-grained (``private_key``, ``prompt_injection``, ``policy:<name>`` ...)
    category: str | None = None
    #: confidence in [0, 1]
    score: float = 1.0
    #: position in the request's input list (None: the turn as a whole, e.g. too many items)
    index: int | None = None
    item_id: str | None = None
    #: which rule matched (a pattern name; safe to log)
    rule: str | None = None
    #: which classifier said so: ``secrets``, ``injection``, ``policy``, ``external``
    source: str = ""
    #: a human label for error messages ("a private key"); never the matched value
    label: str | None = None
    #: a redacted hint for reviewers (type, length, masked excerpt); never the matched value
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "category": self.category,
            "score": round(self.score, 3),
            "index": self.index,
            "item_id": self.item_id,
            "rule": self.rule,
            "source": self.source,
            "hint": self.hint,
        }


class Classifier(Protocol):
    """``classify`` gets the turn's new items as text and returns its non-allow verdicts (an
    empty list means: all allowed). It must not log or return matched values."""

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]: ...


class ClassifierUnavailable(Exception):
    """A classifier that is configured fail-closed could not decide (the pipeline answers 503)."""


#: what one item weighs in ``Composite``'s choice of a worker thread, in bytes of text
ITEM_WORK_BYTES = 128


class Composite:
    """Runs several classifiers over the same items (the I/O-bound ones concurrently) and merges
    their verdicts.

    Every non-allow verdict is kept (one item may carry a secret *and* an injection); the turn's
    decision is the most severe one (block > flag > allow). ``overrides`` lets an operator change
    the action per category or per source (``{"private_key": "block", "injection": "block"}``):
    the category wins over the source.
    """

    def __init__(
        self,
        classifiers: Sequence[Classifier],
        overrides: Mapping[str, Action] | None = None,
        *,
        thread_bytes: int = 256 * 1024,
    ) -> None:
        self.classifiers = tuple(classifiers)  # fixed: the split below is derived from it once
        #: which wait on I/O (``io = True``: the external one) and which scan in CPU, sorted once
        self._io = [c for c in self.classifiers if getattr(c, "io", False)]
        self._local = [c for c in self.classifiers if not getattr(c, "io", False)]
        self._scans = all(hasattr(c, "scan") for c in self._local)
        self.overrides = dict(overrides or {})
        #: inputs larger than this are scanned in a worker thread (see ``classify``)
        self.thread_bytes = thread_bytes

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]:
        if not items or not self.classifiers:
            return []
        # Classifiers that wait on I/O (``io = True``: the external one) run as tasks while the
        # CPU-only ones run inline: a task per classifier would cost more than a short item's scan.
        tasks = [asyncio.ensure_future(c.classify(items)) for c in self._io]
        local = self._local
        try:
            # an item costs the scans as much as ~128 bytes of its text does (5-7 us against 50 ns a
            # byte): 20,000 one-word items take as long as 2.5 MB of text
            work = sum(it.nbytes for it in items) + ITEM_WORK_BYTES * len(items)
            if work > self.thread_bytes and self._scans:
                # A multi-megabyte tool output takes the regexes a while: scanning in a worker
                # thread lets the event loop keep serving other connections meanwhile (the GIL
                # is shared, but released between bytecodes every few milliseconds).
                # (``_scans``: each local classifier has ``scan``, which the protocol does not name)
                results = await asyncio.to_thread(lambda: [c.scan(items) for c in local])  # type: ignore[attr-defined]
            else:
                results = [await c.classify(items) for c in local]
            if tasks:
                results += await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        if not any(results):  # the usual answer: nothing found, nothing to merge
            return []
        merged = [self._override(v) for verdicts in results for v in verdicts]
        merged = [v for v in merged if v.action != "allow"]
        merged.sort(key=lambda v: (-SEVERITY[v.action], v.index if v.index is not None else -1, -v.score))
        return merged

    async def close(self) -> None:
        """Close classifiers that hold connections (the external one)."""
        for c in self.classifiers:
            close = getattr(c, "close", None)
            if close is not None:
                await close()

    def _override(self, v: Verdict) -> Verdict:
        action = self.overrides.get(v.category or "") or self.overrides.get(v.source)
        return replace(v, action=action) if action is not None and action in SEVERITY else v


def needle_windows(
    text: str, lower: str, needles: Iterable[str], before: int, after: int, max_windows: int = 256
) -> list[tuple[int, int]]:
    """Merged ``[lo, hi)`` windows around each occurrence of any lowercase ``needle`` in ``lower``.

    Why: a regex scan over a whole tool output costs far more per byte than ``str.find``, and the
    things classifiers look for are anchored on a few keywords (a token prefix, "ignore", "password").
    Scanning only windows around keyword hits keeps the cost near ``str.find`` speed for ordinary
    text. When the windows would cover most of the text anyway, or ``lower`` is not position-aligned
    with ``text`` (a few Unicode characters change length when lowercased), the whole text is one
    window. The caller sizes ``before``/``after`` so any match containing the needle fits.
    """
    n = len(text)
    if len(lower) != n:
        return [(0, n)]
    spans: list[tuple[int, int]] = []
    for needle in needles:
        i = lower.find(needle)
        while i != -1:
            spans.append((max(0, i - before), min(n, i + len(needle) + after)))
            if len(spans) > max_windows:
                return [(0, n)]
            i = lower.find(needle, i + 1)
    if not spans:
        return []
    spans.sort()
    merged = [spans[0]]
    for lo, hi in spans[1:]:
        if lo <= merged[-1][1]:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    if sum(hi - lo for lo, hi in merged) * 2 > n:
        return [(0, n)]
    return merged


def decision(verdicts: Iterable[Verdict]) -> Action:
    """The most severe action among ``verdicts`` ("allow" when there are none)."""
    return max((v.action for v in verdicts), key=SEVERITY.__getitem__, default="allow")


def block_message(v: Verdict) -> str:
    """The client-facing reason for a block: the category and where, never the matched value."""
    what = v.label or (f"content in category '{v.category}'" if v.category else "disallowed content")
    where = f"input item {v.index}" if v.index is not None else "the input"
    return f"Your request was blocked by the gateway's content policy: {what} was detected in {where}."
