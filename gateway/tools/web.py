"""The ``web_search`` tool the gateway runs: its backends, a request's tool checked, one browser a response.

    settings ──WebSearch()──────> one backend per configured setting (the deployment's, each tenant's)
    request tool ──tool()───────> WebTool          (400s: a domain that is not one; no I/O)
    WebTool ──browser()─────────> Browser           (``gateway.tools.browser``: the response's page stack)
    model's call ──Browser.run()─> BrowseResult     (never raises; ``observe`` counts it)

**Who runs it.** ``web_search`` (and its dated aliases) runs when the operator configured a backend
for the request's tenant (``web_search``, or the tenant's entry in ``web_search_tenants``, where
``null`` means none); otherwise it is stripped like any hosted tool the gateway does not run, and
counted (``respgate_hosted_tools_stripped_total``). Keys come from settings only; a request cannot
name a backend, a URL or a key.

**What the request's fields do.**

* ``filters.allowed_domains``: searches return only hits on those domains (and subdomains), and the
  browser opens only pages on them (the final URL after redirects included). A value that is not a
  domain is a 400 here, before the turn runs.
* ``search_context_size``: how much of the web the model reads a turn — ``low`` 5 hits and 2,048
  characters a screen, ``medium`` (default) 10 and 4,096 (about the 1,024 tokens gpt-oss's browser
  shows), ``high`` 20 and 8,192; never more hits than the backend's ``max_results``.
* ``user_location``: handed to the backend (each backend's docstring says which fields its API
  takes; SearXNG takes none).
* ``external_web_access: false`` (OpenAI's cache-only mode): the gateway has no cache of pages, so
  searches still run (their snippets are the backend's) and ``open`` answers the model that live
  page access is off for this request.
* ``include: ["web_search_call.action.sources"]``: a ``search`` action lists the hits' URLs.

**Pages** are fetched through the outbound guard (``security.outbound``): the deployment's
``outbound_allow_networks`` only, every resolved address of every hop checked, no cookies, one
deadline (``web_page_timeout_s``), a byte cap on the wire (``web_page_max_bytes``) and a cut of the
extracted text (``web_page_max_chars``); the extraction runs in a worker thread.

Nothing here logs a query, a URL or a page: they are user data. Metrics carry the backend's kind, the
action and the outcome word only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.base.metrics import Metrics, StageTimer
from gateway.base.settings import Settings, WebSearchSetting
from gateway.tools.browser import Browser, BrowseResult
from gateway.tools.calls import WEB_SEARCH, CallResult
from gateway.tools.pages import Page, open_page
from gateway.tools.search import (
    BraveBackend,
    BraveConfig,
    SearchBackend,
    SearxngBackend,
    SearxngConfig,
    TavilyBackend,
    TavilyConfig,
    UserLocation,
)
from gateway.tools.search.domains import DomainFilter
from gateway.wire.errors import bad_request
from gateway.wire.tools import WebSearchTool
from security.outbound import OutboundPolicy

log = logging.getLogger(__name__)

#: ``search_context_size`` -> (hits a search shows, characters a screen shows)
CONTEXT_SIZES: Mapping[str, tuple[int, int]] = {"low": (5, 2048), "medium": (10, 4096), "high": (20, 8192)}
#: the ``include`` value that lists a search's hits in its action
INCLUDE_SOURCES = "web_search_call.action.sources"


@dataclass(frozen=True, slots=True)
class WebTool:
    """One request's ``web_search`` tool, checked: the backend it searches and what it may show."""

    backend: SearchBackend
    #: the tool's index in the request's ``tools`` (for messages)
    index: int
    allowed_domains: tuple[str, ...] | None
    user_location: UserLocation | None
    max_results: int
    view_chars: int
    #: ``include`` asked for ``web_search_call.action.sources``
    sources: bool
    #: pages may be opened (``external_web_access`` is not false)
    open_pages: bool


def build_backend(setting: WebSearchSetting) -> SearchBackend:
    """The backend a setting names (ValueError for a setting its config refuses)."""
    common: dict[str, Any] = {
        "timeout_s": setting.timeout_s,
        "max_results": setting.max_results,
        "allow_networks": tuple(setting.allow_networks),
    }
    if setting.url:
        common["base_url"] = setting.url
    if setting.backend == "searxng":
        return SearxngBackend(SearxngConfig(**common))
    common["api_key"] = setting.api_key
    if setting.backend == "brave":
        return BraveBackend(BraveConfig(**common))
    return TavilyBackend(TavilyConfig(**common))


class WebSearch:
    """The gateway's ``web_search`` side: the backends by tenant, the page reader, the metrics."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        cpu: Callable[..., Awaitable[Any]] | None = None,
        backends: Mapping[str | None, SearchBackend | None] | None = None,
    ) -> None:
        """``backends``: tenant (None: the deployment's default) -> backend, instead of building them
        from settings (tests)."""
        self.settings = settings
        self.metrics = metrics
        self._cpu = cpu
        if backends is not None:
            built = dict(backends)
        else:
            built = {None: build_backend(settings.web_search) if settings.web_search is not None else None}
            for tenant, setting in settings.web_search_tenants.items():
                built[tenant] = build_backend(setting) if setting is not None else None
        self._default = built.pop(None, None)
        self._tenants: dict[str, SearchBackend | None] = {k: v for k, v in built.items() if k is not None}
        self._policy = OutboundPolicy(allow_networks=tuple(settings.outbound_allow_networks))

    def backend_for(self, tenant: str | None) -> SearchBackend | None:
        if tenant is not None and tenant in self._tenants:
            return self._tenants[tenant]
        return self._default

    def enabled(self, tenant: str | None) -> bool:
        """Whether the gateway runs ``web_search`` for ``tenant`` (else it is stripped)."""
        return self.backend_for(tenant) is not None

    @property
    def any_enabled(self) -> bool:
        return self._default is not None or any(b is not None for b in self._tenants.values())

    def tool(self, index: int, model: WebSearchTool, tenant: str | None, include: Sequence[str] = ()) -> WebTool:
        """The request's tool checked against the tenant's backend (raises ``ApiError``)."""
        backend = self.backend_for(tenant)
        if backend is None:  # ToolChecks keeps the tool only for a tenant with a backend
            raise bad_request("web_search is not enabled for your API key on this gateway.", param="tools")
        domains = model.filters.allowed_domains if model.filters is not None else None
        if domains is not None:
            try:
                DomainFilter(domains)
            except ValueError as exc:
                raise bad_request(
                    f"Invalid 'tools[{index}].filters.allowed_domains': {exc}.",
                    code="invalid_value",
                    param=f"tools[{index}].filters.allowed_domains",
                ) from None
        loc = model.user_location
        location = (
            UserLocation(
                country=loc.country.upper() if loc.country else None,
                region=loc.region,
                city=loc.city,
                timezone=loc.timezone,
            )
            if loc is not None
            else None
        )
        hits, screen = CONTEXT_SIZES[model.search_context_size or "medium"]
        return WebTool(
            backend=backend,
            index=index,
            allowed_domains=tuple(domains) if domains else None,
            user_location=location,
            max_results=hits,
            view_chars=screen,
            sources=INCLUDE_SOURCES in include,
            open_pages=model.external_web_access is not False,
        )

    def browser(self, tool: WebTool) -> Browser:
        """A response's browser: its own page stack over the tool's backend and the page reader."""
        return Browser(
            backend=tool.backend,
            open_page=self.open_page if tool.open_pages else _no_live_access,
            max_results=tool.max_results,
            view_chars=tool.view_chars,
            allowed_domains=tool.allowed_domains,
            user_location=tool.user_location,
        )

    async def open_page(self, url: str) -> Page:
        """One page through the outbound guard, with the deployment's limits."""
        s = self.settings
        return await open_page(
            url,
            policy=self._policy,
            max_bytes=s.web_page_max_bytes,
            timeout_s=s.web_page_timeout_s,
            max_chars=s.web_page_max_chars,
            cpu=self._cpu,
        )

    def observe(self, result: BrowseResult, seconds: float) -> None:
        """Count one action (``respgate_web_search_actions_total``, ``..._action_seconds``)."""
        action = str(result.action.get("type", "invalid"))
        self.metrics.web_actions.labels(result.backend, action, result.failure or "ok").inc()
        self.metrics.web_action_seconds.labels(result.backend, action).observe(seconds)

    async def aclose(self) -> None:
        """Shutdown: close every backend's connection pool."""
        backends = {id(b): b for b in (self._default, *self._tenants.values()) if b is not None}
        results = await asyncio.gather(*(b.aclose() for b in backends.values()), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.warning("closing a web search backend failed: %s", type(r).__name__)


class WebRunner:
    """One response's ``web_search`` calls (``gateway.tools.calls``): each browser call run, counted
    and traced (no query, URL or page in a span: they are user data), its action shaped as the
    SDK types it (every field present; a search's ``sources`` only when ``include`` asked)."""

    kind = WEB_SEARCH

    def __init__(self, web: WebSearch, browser: Browser, tool: WebTool, clock: StageTimer) -> None:
        self.web = web
        self.browser = browser
        self.tool = tool
        self.clock = clock

    async def run(self, function: str, arguments: str) -> CallResult:
        t0 = time.perf_counter()
        result = await self.browser.run(function, arguments)
        t1 = time.perf_counter()
        self.web.observe(result, t1 - t0)
        self.clock.span(
            "tool_call",
            t0,
            t1,
            {
                "respgate.tool.type": "web_search",
                "respgate.tool.server": result.backend,
                "respgate.tool.name": str(result.action.get("type", "invalid")),
                "respgate.tool.output_bytes": len(result.text),
                **({"error.type": result.failure} if result.failure is not None else {}),
            },
        )
        return CallResult(result.text, {"action": self._action(result.action)}, result.failure is not None)

    def not_run(self, function: str, text: str) -> CallResult:
        return CallResult(text, {}, True)

    def _action(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        action = dict(raw)
        if action.get("type") == "search":
            if not self.tool.sources:
                action["sources"] = None
            action.setdefault("sources", None)
            action.setdefault("query", None)
            action.setdefault("queries", [action["query"]] if action["query"] else None)
        elif action.get("type") == "open_page":
            action.setdefault("url", None)
        return action


async def _no_live_access(url: str) -> Page:
    """``external_web_access: false``: no page is fetched (the model reads why)."""
    from gateway.tools.pages import PageFailed, PageFailure

    raise PageFailed(
        PageFailure.REFUSED, "Opening pages is turned off for this request (external_web_access is false).", host=""
    )
