"""A fetched body to a ``Page``: decode it, defuse it, extract its main text, wrap it into lines.

CPU work, linear in the body (bounded by the fetch's byte cap before it gets here); it runs in a
worker thread (``read``), never on the event loop. Each bound says what it defends against:
``MAX_TAG_CHARS`` (an attribute bomb), ``MAX_TAGS`` (trafilatura's per-element Python cost), the
``max_chars`` cut with ``CUT_MARKER``. The page's own ``【``/``】`` become ``〖``/``〗`` so a page
cannot forge a citation mark.
"""

from __future__ import annotations

import codecs
import re
import textwrap
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.tools.pages.page import Page, PageFailed, PageFailure

#: gpt-oss's browser wraps page text at this width before numbering the lines
LINE_WIDTH = 80
#: ends a text cut at ``max_chars`` (``{n}``: the limit)
CUT_MARKER = "[... page text cut at {n} characters ...]"
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES = frozenset({"text/plain"})
#: a ``<meta charset>`` or ``http-equiv`` content-type declaration in the first bytes of a page
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_META_SNIFF_BYTES = 4096
#: the page's own citation brackets, which would let it forge a ``【3†L1-L2】`` mark
_BRACKETS = str.maketrans({"【": "〖", "】": "〗", "\u200b": None})
_BLANK_RUNS = re.compile(r"\n{3,}")
#: a tag longer than this is cut to its name before parsing (see ``_defuse``)
MAX_TAG_CHARS = 2048
_TAG_NAME = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]{0,30}")
#: a page with more tags than this is read by the cheap path, all its text (see ``_extract_html``)
MAX_TAGS = 60_000


@dataclass(frozen=True, slots=True)
class Fetched:
    """What the fetch hands over: the final URL, the declared type and charset, the body bytes."""

    url: str
    media_type: str
    charset: str | None
    body: bytes


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def read(fetched: Fetched, max_chars: int) -> Page:
    """Decode and extract (CPU: runs in a worker thread)."""
    host = _host(fetched.url)
    body = fetched.body
    media_type = fetched.media_type or _sniff(body)
    if media_type not in HTML_TYPES and media_type not in TEXT_TYPES:
        raise PageFailed(
            PageFailure.UNSUPPORTED_TYPE, f"The page at {host!r} has no type that reads as text.", host=host
        )
    text_in = _decode(body, fetched.charset, html=media_type in HTML_TYPES)
    if media_type in HTML_TYPES:
        title, text = _extract_html(text_in, fetched.url)
    else:
        title, text = "", text_in
    text = _BLANK_RUNS.sub("\n\n", text.translate(_BRACKETS).replace("\r\n", "\n").replace("\r", "\n")).strip()
    if not text and not title:
        raise PageFailed(PageFailure.UNREADABLE, f"No text could be read from the page at {host!r}.", host=host)
    cut = len(text) > max_chars
    if cut:
        text = text[:max_chars].rstrip() + "\n\n" + CUT_MARKER.format(n=max_chars)
    title = " ".join(title.translate(_BRACKETS).split())[:300] or host
    return Page(url=fetched.url, title=title, text=text, lines=_wrap(text), content_type=media_type, cut=cut)


def _sniff(body: bytes) -> str:
    """A type for a body its server did not type: HTML if it starts like HTML, else none."""
    head = body[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return "text/html" if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) else ""


def _decode(body: bytes, declared: str | None, *, html: bool) -> str:
    """The body as text: a byte-order mark first, then the declared charset (header, then an HTML
    ``<meta>``), then UTF-8 if it is valid, then charset_normalizer's best guess."""
    for bom, name in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if body.startswith(bom):
            return body.decode(name, errors="replace").lstrip("\ufeff")
    candidates = [declared] if declared else []
    if html:
        found = _META_CHARSET.search(body[:_META_SNIFF_BYTES])
        if found:
            candidates.append(found.group(1).decode("ascii", "ignore"))
    for name in candidates:
        try:
            codec = codecs.lookup(name)
        except LookupError:
            continue
        if codec.name == "iso8859-1" or codec.name == "ascii":
            codec = codecs.lookup("cp1252")  # as browsers do (WHATWG Encoding: latin1 means windows-1252)
        return body.decode(codec.name, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    import charset_normalizer

    best = charset_normalizer.from_bytes(body).best()
    return str(best) if best is not None else body.decode("cp1252", errors="replace")


def _defuse(html: str) -> str:
    """``html`` with every tag longer than ``MAX_TAG_CHARS`` replaced by its bare name (``<p>``).

    Why: libxml2 checks an element's attributes against each other, so a tag's cost grows with the
    square of its attribute count — a 2 MB page of one ``<p>`` with 150,000 attributes parsed for
    over two minutes (measured), in a thread nothing can stop. Real tags that long are SVG paths,
    ``data:`` image URLs and tracking links, whose attributes carry no text to read. One pass, linear:
    each ``<`` is matched with the next ``>`` and the scan goes on after it."""
    out: list[str] = []
    pos = 0
    while True:
        start = html.find("<", pos)
        if start < 0:
            out.append(html[pos:])
            break
        end = html.find(">", start)
        if end < 0:  # an unclosed tag at the end: the parser would treat it as text anyway
            out.append(html[pos : start + MAX_TAG_CHARS])
            break
        if end - start <= MAX_TAG_CHARS:
            out.append(html[pos : end + 1])
        else:
            name = _TAG_NAME.match(html, start)
            out.append(html[pos:start])
            if name is not None:
                out.append(name.group(0) + ">")
        pos = end + 1
    return "".join(out)


def _extract_html(html: str, url: str) -> tuple[str, str]:
    """(title, main text). trafilatura first; a page it finds no main text in (a short page, a
    listing) falls back to all the text of its body, so the model still sees what is there.

    A page with more than ``MAX_TAGS`` tags skips trafilatura and gives all its text: trafilatura's
    work is Python code per element (about 25 us each, measured: 2 MB of table cells took 9 s, a page
    of 60,000 tags takes about 1.5 s), while lxml's parse and text walk are C (0.6 s for the table)."""
    import trafilatura  # imported on first use, in the worker thread: ~0.3 s, off the event loop

    html = _defuse(html)
    tree = trafilatura.load_html(html)
    if tree is None:
        return "", ""
    title = _title(tree)
    if html.count("<") > MAX_TAGS:
        return title, _all_text(tree)
    text = trafilatura.extract(
        tree,
        url=url,
        output_format="markdown",
        include_formatting=True,
        include_tables=True,
        include_comments=False,
        include_images=False,
        include_links=False,
        deduplicate=False,
    )
    if not text:  # extract may have pruned the tree it was given: read the page afresh
        fresh = trafilatura.load_html(html)
        text = _all_text(fresh) if fresh is not None else ""
    return title, text


def _all_text(tree: Any) -> str:
    """Every text of the page's body, one piece a line; no scripts, styles or comments."""
    import lxml.etree

    lxml.etree.strip_elements(tree, lxml.etree.Comment, "script", "style", "noscript", "template", with_tail=False)
    body = tree.find(".//body")
    return "\n".join(t.strip() for t in (body if body is not None else tree).itertext() if t.strip())


def _title(tree: Any) -> str:
    for path in (".//head/title", ".//title", ".//h1"):
        node = tree.find(path)
        if node is not None:
            text = " ".join(node.itertext()).strip()
            if text:
                return str(text)
    return ""


def _wrap(text: str) -> tuple[str, ...]:
    """Lines of at most ``LINE_WIDTH`` columns, blank lines kept: the lines the model cites."""
    lines: list[str] = []
    for line in text.split("\n"):
        if not line:
            lines.append("")
            continue
        lines.extend(textwrap.wrap(line, width=LINE_WIDTH, replace_whitespace=False, drop_whitespace=False) or [""])
    return tuple(lines)
