"""Page reading for ``web_search``: open a URL the model chose, extract its main text, find in it.

Why it is shaped this way:

* **The URL is the model's choice, and so the requester's.** A search result, or a URL a prompt
  injection planted, may point at ``http://169.254.169.254/`` or at a redirect that lands there. So
  every fetch goes through the same outbound guard as MCP (``security.outbound.guarded_client``):
  each resolved address of each connection — the first and one per redirect hop — is checked at
  connect time and pinned, proxies from the environment are never used, ``Accept-Encoding:
  identity`` is asked for and a compressed answer refused (a gzip bomb would multiply the byte cap),
  and the body is cut at ``max_bytes`` on the wire. Redirects are followed at most
  ``max_redirects`` times; only ``http`` and ``https`` are opened, and a URL carrying credentials
  is not (the model must not be able to make the gateway log in anywhere).
* **No cookies, ever.** Each fetch has a client of its own whose cookie jar accepts nothing, so a
  cookie set by one page (or one redirect hop) is sent nowhere — not to the next hop, not to the
  next fetch, not to another tenant's.
* **One deadline for the whole fetch** (``timeout_s``): connecting, every redirect, and reading the
  body. A server that sends its headers and then a byte a second forever never trips a per-read
  timeout; the deadline ends it.
* **Extraction off the event loop, bounded.** Parsing HTML is CPU work linear in its size (about
  1 s per MB with trafilatura, measured). It runs in a worker thread (``cpu``: the gateway's prepare
  pool, ``gateway.turn.offload.Cpu``, or ``asyncio.to_thread`` by default) on at most ``max_bytes``
  of input, and its output is cut at ``max_chars`` with a marker that says so.
* **A well-kept library for the solved problem**: trafilatura (Apache-2.0) finds the main text and
  drops navigation, ads and footers, keeping headings and code blocks as Markdown.
* **Shown as gpt-oss's browser shows pages**, since gpt-oss was trained on its ``browser`` tool:
  the text is wrapped at 80 columns into lines numbered ``L0: ...``, which the model cites as
  ``【{cursor}†L{start}-L{end}】``; ``find`` is a case-insensitive substring search that returns
  each match with the lines that follow it. The page's own ``【`` and ``】`` become ``〖`` and ``〗``,
  so a page cannot forge a citation mark.
* **One error type** (``PageFailed``) with a kind (``PageFailure``) and a message that names the
  host and the reason only (never the path, the query or a header), so it can be shown to the model.

What the lead still wires (not here, on purpose): the ``open_page``/``find`` actions in the tool
loop and their ``web_search_call`` items and events; the settings (``max_bytes``, ``timeout_s``,
``max_chars``, ``max_redirects``, the allowed networks) and the metrics (page opens, failures by
kind, latency); the cursor/page stack per response and the harmony rendering of a view
(:meth:`Page.view` gives gpt-oss's screen, sized in characters, not tokens) and of ``find``'s
results; running the classifiers on the page text as new input.
"""

from gateway.tools.pages.extract import CUT_MARKER, MAX_TAG_CHARS, MAX_TAGS
from gateway.tools.pages.fetch import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_USER_AGENT,
    CpuRunner,
    open_page,
)
from gateway.tools.pages.page import VIEW_CHARS, FindMatch, Page, PageFailed, PageFailure, find

__all__ = [
    "CUT_MARKER",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_USER_AGENT",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "VIEW_CHARS",
    "CpuRunner",
    "FindMatch",
    "Page",
    "PageFailed",
    "PageFailure",
    "find",
    "open_page",
]
