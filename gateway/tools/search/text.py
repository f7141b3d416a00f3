"""A backend's title or snippet as plain text of bounded length.

SearXNG and Brave put markup in snippets (``<strong>`` around the matched words, entities such
as ``&amp;``); the model should read text, and the length of what enters its context is the
operator's to bound. The stdlib HTML parser does the stripping (tags dropped, character references
decoded, ``<script>``/``<style>`` contents dropped), then whitespace is collapsed and the text cut.
The raw input is cut before parsing too, so a megabyte snippet costs no more than a short one.
"""

from __future__ import annotations

from html.parser import HTMLParser

__all__ = ["clean_text"]

_ELLIPSIS = "\u2026"
_SKIPPED = frozenset({"script", "style"})


class _TextOnly(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self._skipping += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED and self._skipping:
            self._skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def clean_text(raw: object, limit: int) -> str:
    """``raw`` (a backend's field; anything not a string counts as empty) as plain text of at most
    ``limit`` characters, ending in an ellipsis when it was cut."""
    if not isinstance(raw, str) or limit <= 0:
        return ""
    parser = _TextOnly()
    # markup and entities take more characters than the text they make: 8x leaves room for them
    parser.feed(raw[: limit * 8 + 64])
    parser.close()
    text = " ".join("".join(parser.parts).split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + _ELLIPSIS
    return text
