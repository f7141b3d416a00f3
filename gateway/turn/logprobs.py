"""Logprobs of the output text: the engine's per-token values, attached to the text each token wrote.

Asked for by ``include: ["message.output_text.logprobs"]`` or ``top_logprobs`` (``sampling``), the
engine reports a :class:`~inference.engine.TokenLogprob` per sampled token. A parser turns tokens
into text deltas without saying which token wrote which text (headers, tags and held-back bytes
write none), so the turn then feeds the parser one token at a time and attributes to each text
delta the tokens whose bytes spell it: the longest run of the most recent unattributed tokens that
ends the delta's bytes exactly (a character split over two tokens, text a parser held back for a
token or two). Tokens that wrote no text of the message (harmony headers, ``<tool_call>`` tags,
reasoning) are never attributed. Cost: only turns that ask pay the per-token feeding.

Entries have OpenAI's shape: ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from inference.engine import TokenLogprob
from inference.parse import ItemDelta, ParseEvent, StreamParser
from inference.renderer import Renderer

#: unattributed tokens kept at most (a delta is never longer than a few held-back tokens)
PENDING = 64

Entry = dict[str, Any]


class LogprobAttribution:
    def __init__(self, renderer: Renderer) -> None:
        self._renderer = renderer
        self._pending: deque[tuple[bytes, Entry]] = deque(maxlen=PENDING)

    def feed(
        self, parser: StreamParser, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]
    ) -> tuple[list[ParseEvent], dict[int, list[Entry]]]:
        """Parse ``token_ids`` one by one; returns the parse events and, per ``ItemDelta`` index,
        the entries of the tokens that wrote it."""
        events: list[ParseEvent] = []
        attributed: dict[int, list[Entry]] = {}
        for tok, lp in zip(token_ids, logprobs):
            raw = self._renderer.token_bytes(tok)
            self._pending.append((raw, self._entry(raw, lp)))
            for ev in parser.feed([tok]):
                if isinstance(ev, ItemDelta) and ev.text:
                    attributed[len(events)] = self._take(ev.text.encode("utf-8", "surrogatepass"))
                events.append(ev)
        return events, attributed

    def _take(self, text: bytes) -> list[Entry]:
        pending = self._pending
        acc = b""
        i = len(pending)
        while i > 0 and len(acc) < len(text):
            i -= 1
            acc = pending[i][0] + acc
        if acc == text:
            taken = [entry for _, entry in list(pending)[i:]]
        else:  # the parser rewrote the text (it is not the tokens' bytes): the latest token wrote it
            taken = [pending[-1][1]] if pending else []
        pending.clear()
        return taken

    def _entry(self, raw: bytes, lp: TokenLogprob) -> Entry:
        top = []
        for tok, logprob in lp.top:
            b = raw if tok == lp.token_id else self._renderer.token_bytes(tok)
            top.append({"token": b.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(b)})
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp.logprob, "bytes": list(raw), "top_logprobs": top}
