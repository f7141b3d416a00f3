"""An opened page as the model reads it: lines numbered as gpt-oss's browser numbers them, one
screen of it (``Page.view``), ``find`` in it, and the one failure type of page reading.

The kinds of failure live here, in one place, so the fetch, the extraction and the lead's metrics and
``web_search_call`` errors all name them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: one screen of a page (``Page.view``): about the 1,024 tokens gpt-oss's browser shows at a time
VIEW_CHARS = 4096
#: the most characters of a URL shown in a view's header
MAX_SHOWN_URL = 200
#: ``find``'s defaults, as gpt-oss's browser: at most 50 matches, each shown with 4 lines
FIND_MAX_MATCHES = 50
FIND_SHOW_LINES = 4
#: the longest pattern ``find`` takes (a pattern longer than any line can match nothing anyway)
FIND_MAX_PATTERN = 1000


class PageFailure(StrEnum):
    """Why a page could not be read (the value is the word used in messages and metrics)."""

    REFUSED = "refused"  # the outbound policy: a blocked address, a scheme, credentials in the URL
    TOO_LARGE = "too_large"  # the body went (or said it would go) past max_bytes
    TIMEOUT = "timeout"  # the fetch's deadline passed (connect, redirects and body together)
    UNSUPPORTED_TYPE = "unsupported_type"  # not HTML, XHTML or plain text
    HTTP_ERROR = "http_error"  # an error status, too many redirects, no connection, a broken exchange
    UNREADABLE = "unreadable"  # a compressed answer, or nothing could be made of the body


class PageFailed(Exception):
    """A page could not be read. ``str(exc)`` names the host and the reason only, so it can be
    shown to the model and the API client; ``kind`` says which failure it was."""

    def __init__(self, kind: PageFailure, message: str, *, host: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.host = host


@dataclass(frozen=True, slots=True)
class Page:
    """An opened page: ``url`` is the final URL (after redirects), ``text`` the extracted main text
    (Markdown-ish: headings, code fences), ``lines`` that text wrapped at 80 columns — the lines the
    model cites by number. ``cut``: the text was cut at ``max_chars`` (its last line says so)."""

    url: str
    title: str
    text: str
    lines: tuple[str, ...]
    content_type: str
    cut: bool = False

    def numbered(self, start: int = 0, stop: int | None = None) -> str:
        """Lines ``start`` to ``stop`` (exclusive) as gpt-oss's browser shows them: ``L12: text``."""
        end = len(self.lines) if stop is None else min(stop, len(self.lines))
        return "\n".join(f"L{i}: {self.lines[i]}" for i in range(max(start, 0), end))

    def view(self, cursor: int, loc: int = 0, max_chars: int = VIEW_CHARS) -> str:
        """One screen of the page as gpt-oss's browser shows it: ``[cursor] title (url)``, a
        ``**viewing lines [a - b] of last**`` bar, a blank line, then the numbered lines from ``loc``
        while they fit in ``max_chars`` (one line at least). ValueError for a ``loc`` past the end
        (its message can be shown to the model)."""
        last = len(self.lines) - 1
        if not 0 <= loc <= last:
            raise ValueError(f"Line {loc} is not on this page; its lines are L0 to L{last}.")
        shown: list[str] = []
        used = 0
        for i in range(loc, last + 1):
            line = f"L{i}: {self.lines[i]}"
            if shown and used + len(line) + 1 > max_chars:
                break
            shown.append(line)
            used += len(line) + 1
        bar = f"**viewing lines [{loc} - {loc + len(shown) - 1}] of {last}**"
        return f"[{cursor}] {self.title} ({self.url[:MAX_SHOWN_URL]})\n{bar}\n\n" + "\n".join(shown)


@dataclass(frozen=True, slots=True)
class FindMatch:
    """One ``find`` hit: the number of the matching line and the lines shown from it on."""

    line: int
    lines: tuple[str, ...]

    def numbered(self) -> str:
        return "\n".join(f"L{self.line + i}: {text}" for i, text in enumerate(self.lines))


def find(
    page: Page, pattern: str, *, max_matches: int = FIND_MAX_MATCHES, show_lines: int = FIND_SHOW_LINES
) -> list[FindMatch]:
    """The lines of ``page`` that contain ``pattern`` (case-insensitive), each with the
    ``show_lines`` lines from it on, at most ``max_matches``; as gpt-oss's browser, the search goes
    on after the lines a match showed, so matches do not overlap. An empty pattern finds nothing."""
    needle = pattern.casefold()[:FIND_MAX_PATTERN]
    if not needle.strip() or max_matches <= 0:
        return []
    show = max(show_lines, 1)
    matches: list[FindMatch] = []
    i = 0
    while i < len(page.lines) and len(matches) < max_matches:
        if needle in page.lines[i].casefold():
            matches.append(FindMatch(line=i, lines=page.lines[i : i + show]))
            i += show
        else:
            i += 1
    return matches
