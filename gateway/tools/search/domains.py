"""``allowed_domains``: which result URLs a search may return, decided on the host, done right.

Each backend passes the domains to its service as it can (``site:`` terms, Tavily's
``include_domains``), but a service's filter is a hint, not a guarantee (SearXNG hands ``site:``
to engines that may ignore it), so every hit is checked here again and one outside the list is
dropped. The check compares hosts in one canonical form:

* lower case, without the trailing dot of a fully qualified name (``Example.COM.`` is
  ``example.com``);
* IDNA: a Unicode name and its ``xn--`` form are one host (UTS 46 mapping, the ``idna`` package,
  IDNA 2008; Python's own ``idna`` codec is IDNA 2003 and maps some names differently);
* a domain allows itself and its subdomains, label-wise: ``example.com`` allows
  ``docs.example.com`` and not ``evil-example.com`` nor ``example.com.evil.net``;
* only ``http``/``https`` URLs with a host count (no ``javascript:``, ``data:``, ``file:``), and
  a URL with userinfo (``https://example.com@evil.net/``) is judged by its real host.

An entry that is not a domain (empty, a space, ``*`` in the middle, a bad IDNA label) is a
``ValueError`` with a message safe to show: the caller answers it as a bad request.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

import idna

__all__ = ["MAX_ALLOWED_DOMAINS", "MAX_URL_CHARS", "DomainFilter", "canonical_host", "normalize_domain"]

#: OpenAI documents up to 100 entries in ``filters.allowed_domains``; more is refused
MAX_ALLOWED_DOMAINS = 100
#: a result URL longer than this is dropped (no browser-usable URL is; a longer one is junk)
MAX_URL_CHARS = 2048

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_URL_JUNK = re.compile(r"[\x00-\x20\x7f]")


def canonical_host(host: str) -> str | None:
    """``host`` in canonical form (lower case, no trailing dot, IDNA A-labels; an IP literal as
    ``ipaddress`` spells it), or None when it is not a host name."""
    text = host.strip().rstrip(".")
    if not text or len(text) > 253 + 2:
        return None
    try:
        return str(ipaddress.ip_address(text.removeprefix("[").removesuffix("]")))
    except ValueError:
        pass
    try:
        ascii_host = idna.encode(text, uts46=True).decode("ascii").lower()
    except (idna.IDNAError, UnicodeError, ValueError):
        return None
    if len(ascii_host) > 253 or not all(_LABEL.fullmatch(label) for label in ascii_host.split(".")):
        return None
    return ascii_host


def normalize_domain(value: str) -> str:
    """One ``allowed_domains`` entry in canonical form. A scheme and a path are tolerated and
    dropped (``https://example.com/docs`` is ``example.com``), as is a leading ``*.`` (subdomains
    are allowed anyway); anything else that is not a host name is a ValueError."""
    text = value.strip()
    lowered = text.lower()
    for scheme in ("https://", "http://"):
        if lowered.startswith(scheme):
            text = text[len(scheme) :]
            break
    text = text.split("/", 1)[0].removeprefix("*.")
    host = canonical_host(text) if _is_ipv6(text) or (text and ":" not in text) else None
    if host is None:
        shown = value if len(value) <= 80 else value[:80] + "..."
        raise ValueError(f"allowed_domains: {shown!r} is not a domain name")
    return host


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def _url_host(url: str) -> str | None:
    if len(url) > MAX_URL_CHARS or _URL_JUNK.search(url):
        return None
    try:
        parts = urlsplit(url)
        hostname = parts.hostname  # after any userinfo, lower-cased, brackets removed
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not hostname:
        return None
    return canonical_host(hostname)


class DomainFilter:
    """Which hosts a search may return: all (no list given) or the listed domains and their
    subdomains. Built once per search from the request's list (ValueError for a bad entry)."""

    __slots__ = ("domains",)

    def __init__(self, allowed_domains: Iterable[str] | None = None) -> None:
        domains: list[str] = []
        if allowed_domains is not None:
            entries = list(allowed_domains)
            if len(entries) > MAX_ALLOWED_DOMAINS:
                raise ValueError(f"allowed_domains: at most {MAX_ALLOWED_DOMAINS} entries")
            for entry in entries:
                domain = normalize_domain(entry)
                if domain not in domains:
                    domains.append(domain)
        #: the canonical domains, in the request's order (empty: every domain is allowed)
        self.domains: tuple[str, ...] = tuple(domains)

    def __repr__(self) -> str:
        return f"DomainFilter({list(self.domains)!r})"

    def allows_host(self, host: str) -> bool:
        if not self.domains:
            return True
        return any(host == d or host.endswith("." + d) for d in self.domains)

    def allows(self, url: str) -> bool:
        """Whether ``url`` is an http(s) URL whose host is allowed (always False for a URL that
        is not one, whether or not a list was given)."""
        host = _url_host(url)
        return host is not None and self.allows_host(host)

    def site_terms(self, limit: int) -> str:
        """The domains as a search-operator suffix for the query: `` site:a`` for one,
        `` (site:a OR site:b)`` for several, the first ``limit`` of them; ``""`` for none."""
        chosen: Sequence[str] = self.domains[:limit]
        if not chosen:
            return ""
        if len(chosen) == 1:
            return f" site:{chosen[0]}"
        return " (" + " OR ".join(f"site:{d}" for d in chosen) + ")"
