"""Render one harmony message fast: harmony's skeleton, tiktoken's tokens for the text.

Why: ``enc.render(message)`` (openai_harmony, Rust) costs a fixed ~0.15-0.25 ms per call plus
~0.4 ms per KB of text, and turning tool outputs (file reads of 2-8k tokens) into tokens is the
gateway's largest per-turn cost. A harmony message whose content is text parts renders as

    header tokens (role, name, channel, recipient, content type)  ``<|message|>``
    encode_ordinary(part 1) + encode_ordinary(part 2) + ...       terminator

— each part tokenized on its own with ordinary BPE only (``"<|end|>"`` inside text stays text), and
``o200k_harmony``'s ordinary tokens are ``o200k_base``'s. So we render the message once with
*no* content (the skeleton, cached per header: it depends on nothing else) and splice tiktoken's
``encode_ordinary`` of each part in before the terminator. Property tests
(``tests/inference/test_harmony_fast_content.py``) check the result equals ``enc.render`` for
arbitrary text in every message kind the renderer produces.

When we do **not** take the fast path (and call ``enc.render``, so behaviour is harmony's):

* content shorter than :data:`FAST_MIN_CHARS` in total (see its comment for the measurement);
* any content that is not plain ``TextContent`` (system/developer contents);
* text that is not valid UTF-8 (lone surrogates): harmony rejects it with ``ValueError`` while
  tiktoken would silently replace it with U+FFFD, so we let harmony raise;
* a skeleton that does not end in ``<|message|>`` + one terminator (never seen; defensive).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cache.lru import BoundedLRU
from inference.harmony_core import content_encoding, encode_text, harmony_encoding, harmony_tokens

__all__ = ["FAST_MIN_CHARS", "Header", "MessageTokenizer", "message_of"]

log = logging.getLogger(__name__)

#: Total text length (characters) from which a message takes the fast path. Measured on the dev
#: machine (best of 40, a tool output of this repo's Python source, fast path timed through
#: ``render_items`` so it includes building the message): harmony's ``enc.render`` costs ~0.25 ms
#: for an empty or 100-char message and ~0.4 ms/KB beyond; the fast path, skeleton cached, ~0.02 ms
#: and ~0.13 ms/KB (0.04 vs 0.26 ms at 100 chars, 1.1 vs 3.5 ms at 2k tokens, 5.3 vs 14.4 ms at 8k).
#: It wins at every size, so the threshold is 0; the constant stays so tests can force either path
#: and so a future harmony with a cheaper call can raise it.
FAST_MIN_CHARS = 0

#: distinct headers (role, name, channel, recipient, content type) kept; recipients come from
#: tool names, so the set is small, but it is client-controlled, so it is bounded
_MAX_SKELETONS = 1024
_NO_SKELETON = (None, None)
_NEVER = 1 << 62  # min_chars that turns the fast path off

#: a message's header: (role, author name, channel, recipient, content type), the skeleton's key
Header = tuple[str, "str | None", "str | None", "str | None", "str | None"]


def message_of(header: Header, texts: Sequence[str]) -> Any:
    """harmony's ``Message`` with this header and these text parts."""
    from openai_harmony import Author, Message, Role, TextContent

    role, name, channel, recipient, content_type = header
    return Message(
        author=Author(role=Role(role), name=name),
        content=[TextContent(text=t) for t in texts],
        channel=channel,
        recipient=recipient,
        content_type=content_type,
    )


def _utf8_ok(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates). ``isascii`` is O(1) in CPython."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class MessageTokenizer:
    """``render(message)`` with the same result as harmony's ``enc.render(message)``, faster.

    Thread-safe: the skeleton cache is guarded by a lock; tiktoken and harmony encodings are
    immutable. ``fast_renders`` counts messages that took the fast path (tests check it is used).
    """

    def __init__(self, min_chars: int = FAST_MIN_CHARS) -> None:
        self._enc = harmony_encoding()
        self._text = content_encoding()
        tok = harmony_tokens()
        self._message = tok.message
        self._terminators = tok.terminators
        self.min_chars = min_chars
        self.fast_renders = 0
        #: header -> its skeleton, least recently used out (thread-safe: the prepare pool renders too)
        self._skeletons: BoundedLRU[tuple, tuple[list[int] | None, list[int] | None]] = BoundedLRU(_MAX_SKELETONS)
        if not self._agrees():
            log.warning(
                "tiktoken and harmony tokenize message text differently (versions drifted?): "
                "rendering every message with harmony, more slowly"
            )
            self.min_chars = _NEVER

    def _agrees(self) -> bool:
        """Start-up check that the installed tiktoken splits text as harmony does (the property
        tests prove it for the pinned versions; this guards an installation that drifted)."""
        from openai_harmony import Message, Role

        sample = "Hello, wörld! 12345 <|end|> 🎉\n\tdef f(x):\r\n    return x ** 2   \n\n 世界"
        msg = Message.from_role_and_content(Role.USER, sample)
        saved, self.min_chars = self.min_chars, 0
        try:
            return self.render(msg) == self._enc.render(msg)
        finally:
            self.min_chars, self.fast_renders = saved, 0

    def render(self, msg: Any) -> list[int]:
        texts = self._plain_texts(msg)
        if texts is None:
            return self._enc.render(msg)
        head, tail = self._skeleton(msg)
        if head is None or tail is None:
            return self._enc.render(msg)
        return self._splice(head, tail, texts)

    def render_header(self, header: Header, texts: Sequence[str]) -> list[int] | None:
        """:meth:`render` of the message with this header and these text parts, without building
        it (an item is rendered straight from its dict: building harmony's pydantic message cost
        more than tokenizing a short one). None when that message would not take the fast path —
        the caller then builds it and calls :meth:`render`, so harmony decides (and raises)."""
        size = 0
        for text in texts:
            if not _utf8_ok(text):
                return None
            size += len(text)
        if size < self.min_chars:
            return None
        parts = self._skeletons.get(header)
        if parts is None:
            parts = self._skeleton(message_of(header, ()))
        head, tail = parts
        if head is None or tail is None:
            return None
        return self._splice(head, tail, texts)

    def _splice(self, head: list[int], tail: list[int], texts: Sequence[str]) -> list[int]:
        """The skeleton's head, each text part's ordinary tokens, the terminator."""
        out = list(head)
        for text in texts:
            if text:
                out += encode_text(text, self._text)
        out += tail
        self.fast_renders += 1
        return out

    def _plain_texts(self, msg: Any) -> list[str] | None:
        """The message's text parts, or None when it must take harmony's own path."""
        from openai_harmony import TextContent

        texts: list[str] = []
        size = 0
        for part in msg.content:
            if type(part) is not TextContent:
                return None
            text = part.text
            if not _utf8_ok(text):
                return None
            texts.append(text)
            size += len(text)
        return texts if size >= self.min_chars else None

    def _skeleton(self, msg: Any) -> tuple[list[int] | None, list[int] | None]:
        """``(tokens up to and including <|message|>, [terminator])`` of ``msg`` without content."""
        author = msg.author
        key: Header = (author.role.value, author.name, msg.channel, msg.recipient, msg.content_type)
        hit = self._skeletons.get(key)
        if hit is not None:
            return hit
        ids = self._enc.render(msg.model_copy(update={"content": []}))
        parts = _NO_SKELETON
        if len(ids) >= 2 and ids[-2] == self._message and ids[-1] in self._terminators:
            parts = (ids[:-1], ids[-1:])
        self._skeletons.put(key, parts)
        return parts
