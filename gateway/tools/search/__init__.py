"""Web search backends for the gateway's ``web_search`` tool (issue 32, items 2 and 5's backend half).

**Shape.** One small interface (``base.py``: the ``SearchBackend`` protocol, ``SearchHit`` /
``SearchResults``, ``SearchFailed`` with its ``SearchFailure`` kind) and one module per backend
(``searxng.py``, ``brave.py``, ``tavily.py``), each a config dataclass and a class built from it.
What all backends do alike lives once, beside them: the checks before sending (``query.py``), the
bounded HTTP exchange and its mapping of every fault to a kind (``client.py``), the domain filter
(``domains.py``), and the shaping of hits (``hits.py``, ``text.py``). So adding a backend is one
module: a config, a request, and a function from its JSON to ``(url, title, snippet)`` triples.

**Contract the tool loop can rely on.** ``search`` returns results or raises ``SearchFailed``
(whose message is safe for the model and the API client) within its config's ``timeout_s``,
reading at most ``max_response_bytes``; at most ``max_results`` hits, each an http(s) URL on an
allowed domain, with plain, length-capped title and snippet. Nothing here logs: queries and
results are user data.

**What the lead still wires** (deliberately not here, so this package stays free of the turn):

- settings: which backend per deployment (and per tenant), its config fields, API keys from the
  environment or secret files (``gateway/base/settings.py``), and building one backend at start
  and ``aclose`` at shutdown;
- metrics: searches, errors by ``SearchFailure`` and latency, per ``SearchBackend.name``
  (``gateway/base/metrics.py``);
- per-tenant selection of a backend, and ``web_search`` stripped (and counted) when none is set;
- the tool loop: the ``web_search_call`` item and its streaming events, ``filters.allowed_domains``
  and ``user_location`` passed through from the request (a bad domain is ``SearchFailed(refused)``;
  the request validator may check ``DomainFilter(...)`` earlier for a 400), ``open_page`` / ``find``
  through the SSRF-guarded client, and the classifiers over results as new input.
"""

from gateway.tools.search.base import (
    BackendConfig,
    SearchBackend,
    SearchFailed,
    SearchFailure,
    SearchHit,
    SearchResults,
    UserLocation,
)
from gateway.tools.search.brave import BraveBackend, BraveConfig
from gateway.tools.search.domains import DomainFilter
from gateway.tools.search.searxng import SearxngBackend, SearxngConfig
from gateway.tools.search.tavily import TavilyBackend, TavilyConfig

__all__ = [
    "BackendConfig",
    "BraveBackend",
    "BraveConfig",
    "DomainFilter",
    "SearchBackend",
    "SearchFailed",
    "SearchFailure",
    "SearchHit",
    "SearchResults",
    "SearxngBackend",
    "SearxngConfig",
    "TavilyBackend",
    "TavilyConfig",
    "UserLocation",
]
