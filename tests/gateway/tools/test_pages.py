"""gateway/tools/pages/: open a page through the outbound guard, extract its main text, find in it.

A real web site on loopback (tests/web_pages/site.py, uvicorn in a thread) serves real HTML pages and
hostile answers. The fetch's policy allows only the site's own address (``127.0.0.1/32``); a second
copy of the site on 127.0.0.2 stands for the intranet a redirect must not reach, so a guard that
failed to re-check a hop would read its ``SECRET`` and the test would see it. Public-looking names
(``news.example``) are resolved by the policy's resolver hook; nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpcore
import pytest

from gateway.tools.pages import CUT_MARKER, MAX_TAG_CHARS, Page, PageFailed, PageFailure, extract, find, open_page
from security.outbound import OutboundPolicy
from tests.mcp_servers.running import running_app
from tests.web_pages.site import SECRET, site_app

NAMES = {"news.example": "127.0.0.1", "metadata.example": "169.254.169.254", "intranet.example": "127.0.0.2"}


async def _resolver(host: str, port: int) -> Sequence[str]:
    if host in NAMES:
        return [NAMES[host]]
    raise OSError(f"unknown test name {host}")


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with running_app(site_app()) as url:
        yield url


@pytest.fixture(scope="module")
def intranet() -> Iterator[str]:
    with running_app(site_app(), host="127.0.0.2") as url:
        yield url


def _policy(*networks: str) -> OutboundPolicy:
    return OutboundPolicy(allow_networks=networks or ("127.0.0.1/32",), resolver=_resolver)


def _public(site: str) -> str:
    """The site under a public-looking name (resolved to 127.0.0.1 by the test resolver)."""
    return site.replace("127.0.0.1", "news.example")


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address a TCP connection was actually opened to (below the guard)."""
    seen: list[str] = []
    original = httpcore.AnyIOBackend.connect_tcp

    async def recording(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(host)
        return await original(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", recording)
    return seen


async def _failure(url: str, policy: OutboundPolicy | None = None, **kwargs: Any) -> PageFailed:
    with pytest.raises(PageFailed) as info:
        # a safety net, not an assertion on time: a fetch that hung would fail here, not hang the suite
        await asyncio.wait_for(open_page(url, policy=policy or _policy(), **kwargs), timeout=60)
    return info.value


# --- extraction -------------------------------------------------------------------------------


async def test_a_news_article_keeps_its_story_and_drops_nav_ads_and_footer(site: str) -> None:
    page = await open_page(f"{_public(site)}/news", policy=_policy())
    assert page.title == "Harbour bridge reopens after two-year restoration | The Coastal Ledger"
    assert page.url.endswith("/news") and page.url.startswith("http://news.example:")
    assert page.content_type == "text/html" and not page.cut
    for kept in ("1,240 rivets", "Ilse Brandt", "## Traffic plans", "old toll house in the summer"):
        assert kept in page.text
    for dropped in ("ADVERTISEMENT", "Subscribe for 1 euro", "Accept all cookies", "Most read", "All rights reserved"):
        assert dropped not in page.text
    assert all(len(line) <= 80 for line in page.lines)
    assert "\n".join(page.lines).replace("\n", "") == page.text.replace("\n", "")


async def test_a_docs_page_keeps_headings_and_code_blocks(site: str) -> None:
    page = await open_page(f"{site}/docs", policy=_policy())
    assert page.title == "Streaming responses — Tidepool 3.2 documentation"
    assert "# Streaming responses" in page.text and "### Cancellation" in page.text
    assert "```" in page.text
    assert '    return StreamBody(chunks(), media_type="text/plain")' in page.lines
    assert 'write_buffer_limit = "256KiB"' in page.lines
    for dropped in ("Quickstart", "API reference", "Show source"):
        assert dropped not in page.text


async def test_lines_are_numbered_as_gpt_oss_shows_them(site: str) -> None:
    page = await open_page(f"{site}/news", policy=_policy())
    shown = page.numbered(0, 3).split("\n")
    assert shown == [f"L{i}: {page.lines[i]}" for i in range(3)]
    assert page.numbered(len(page.lines) - 1).startswith(f"L{len(page.lines) - 1}: ")
    assert page.numbered(5, 5) == ""


async def test_a_view_is_one_screen_with_a_header_and_a_scrollbar(site: str) -> None:
    page = await open_page(f"{site}/news", policy=_policy())
    view = page.view(3, loc=2, max_chars=400).split("\n")
    last = len(page.lines) - 1
    assert view[0] == f"[3] {page.title} ({page.url})"
    shown = view[3:]
    assert shown == [f"L{2 + i}: {page.lines[2 + i]}" for i in range(len(shown))]
    assert 1 < len(shown) < last and len("\n".join(shown)) <= 400
    assert view[1] == f"**viewing lines [2 - {1 + len(shown)}] of {last}**" and view[2] == ""
    whole = page.view(0, max_chars=10**6).split("\n")
    assert whole[1] == f"**viewing lines [0 - {last}] of {last}**" and len(whole) == 3 + len(page.lines)
    assert page.view(0, loc=last, max_chars=1).endswith(f"L{last}: {page.lines[last]}")  # one line at least
    with pytest.raises(ValueError, match=f"its lines are L0 to L{last}"):
        page.view(0, loc=last + 1)


async def test_text_past_max_chars_is_cut_with_a_marker(site: str) -> None:
    page = await open_page(f"{site}/news", policy=_policy(), max_chars=300)
    assert page.cut
    assert page.text.endswith(CUT_MARKER.format(n=300))
    assert len(page.text) <= 300 + len(CUT_MARKER) + 10
    assert "old toll house" not in page.text


async def test_plain_text_is_read_as_it_is(site: str) -> None:
    page = await open_page(f"{site}/plain", policy=_policy())
    assert page.content_type == "text/plain"
    assert page.lines == ("line one of a plain text file", "line two", "", "Tidepool release notes 3.2")
    assert page.title == "127.0.0.1"  # no title of its own: the host


async def test_charset_from_the_header_and_from_a_meta_tag(site: str) -> None:
    latin = await open_page(f"{site}/latin1", policy=_policy())
    assert latin.title == "Café Müller"
    assert "3,20 € au comptoir" in latin.text  # ISO-8859-1 read as windows-1252, as browsers do
    cyrillic = await open_page(f"{site}/cyrillic", policy=_policy())
    assert cyrillic.title == "Новости"
    assert "открылся новый мост" in cyrillic.text


async def test_an_untyped_html_page_is_sniffed(site: str) -> None:
    page = await open_page(f"{site}/untyped", policy=_policy())
    assert "Untyped page." in page.text


async def test_a_page_cannot_forge_a_citation_mark(site: str) -> None:
    page = await open_page(f"{site}/forged", policy=_policy())
    assert "【" not in page.text and "】" not in page.text
    assert "〖6†L9-L11〗" in page.text


def test_a_tag_past_the_length_cap_is_cut_to_its_name_before_parsing() -> None:
    """The attribute bomb (one tag, 150,000 attributes: minutes of libxml2) becomes a bare tag."""
    bomb = "<p " + " ".join(f"a{i}=1" for i in range(150_000)) + ">kept</p>"
    html = f"<html><body>{bomb}<svg><path d='{'M0 0 L1 1 ' * 500}'/></svg><p class=x>after</p></body></html>"
    assert extract._defuse(html) == "<html><body><p>kept</p><svg><path></svg><p class=x>after</p></body></html>"
    assert extract._defuse("a < b " + "x" * (3 * MAX_TAG_CHARS)) == "a < b " + "x" * (MAX_TAG_CHARS - 4)
    long_comment = "<!-- " + "c" * (2 * MAX_TAG_CHARS) + " -->"
    assert extract._defuse(f"<p>one</p>{long_comment}<p>two</p>") == "<p>one</p><p>two</p>"
    page = extract.read(extract.Fetched("http://x.example/", "text/html", "utf-8", html.encode()), 1000)
    assert "kept" in page.text and "after" in page.text


async def test_a_page_with_more_tags_than_the_cap_is_read_whole_by_the_cheap_path(
    site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_TAGS trafilatura is skipped (its cost is Python per element): all the body's text,
    boilerplate included, and no script or comment."""
    monkeypatch.setattr(extract, "MAX_TAGS", 20)
    page = await open_page(f"{site}/news", policy=_policy())
    assert "1,240 rivets" in page.text and "Most read" in page.text and "All rights reserved" in page.text
    assert page.title == "Harbour bridge reopens after two-year restoration | The Coastal Ledger"


async def test_extraction_runs_on_the_cpu_runner_given(site: str) -> None:
    ran: list[str] = []

    async def cpu(fn: Callable[..., Any], /, *args: Any) -> Any:
        ran.append(fn.__name__)
        return await asyncio.to_thread(fn, *args)

    page = await open_page(f"{site}/docs", policy=_policy(), cpu=cpu)
    assert ran == ["read"] and "Back-pressure" in page.text


# --- the outbound guard -----------------------------------------------------------------------


async def test_a_public_looking_redirect_to_another_loopback_address_is_refused(
    site: str, intranet: str, connects: list[str]
) -> None:
    target = f"{intranet}/secret"
    failed = await _failure(f"{_public(site)}/redirect?to={quote(target)}")
    assert failed.kind is PageFailure.REFUSED
    assert str(failed) == "Refused to connect to '127.0.0.2': it is a loopback address."
    assert connects == ["127.0.0.1"]  # the page server, and nothing after it
    # the control: the same redirect is followed when the target is allowed, so the refusal above
    # is the guard's and not a broken redirect
    allowed = await open_page(
        f"{_public(site)}/redirect?to={quote(target)}", policy=_policy("127.0.0.1/32", "127.0.0.2/32")
    )
    assert SECRET in allowed.text and allowed.url == target


async def test_a_redirect_to_127_0_0_1_is_refused(site: str, intranet: str, connects: list[str]) -> None:
    """The page server on 127.0.0.2 is the allowed one; the redirect points at 127.0.0.1."""
    target = f"{site}/secret"
    failed = await _failure(f"{intranet}/redirect?to={quote(target)}", _policy("127.0.0.2/32"))
    assert failed.kind is PageFailure.REFUSED and "'127.0.0.1': it is a loopback address" in str(failed)
    assert connects == ["127.0.0.2"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/", "Refused to connect to '169.254.169.254': it is a cloud metadata"),
        ("http://metadata.example/latest/meta-data/", "'metadata.example': it resolves to 169.254.169.254, a cloud"),
        ("http://[::ffff:169.254.169.254]/", "cloud metadata address"),
    ],
)
async def test_a_redirect_to_the_metadata_service_is_refused_before_connecting(
    site: str, connects: list[str], target: str, message: str
) -> None:
    failed = await _failure(f"{_public(site)}/redirect?to={quote(target)}")
    assert failed.kind is PageFailure.REFUSED and message in str(failed)
    assert "169.254.169.254" not in "".join(connects) and connects == ["127.0.0.1"]
    assert "latest" not in str(failed) and "meta-data" not in str(failed)  # host and reason only


async def test_a_private_address_is_refused_outright(connects: list[str]) -> None:
    failed = await _failure("http://intranet.example/secret")
    assert failed.kind is PageFailure.REFUSED and failed.host == "intranet.example"
    assert connects == []


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://news.example/x",
        "gopher://news.example/",
        "http:///nohost",
        "http://u:p@news.example/",
        "http://xn--/",  # an IDNA label the client cannot encode
        "http://[::1",
        "http://news.example:99999/",
        "http://news.example/" + "a" * 9000,
    ],
)
async def test_urls_that_are_not_opened_at_all(url: str, connects: list[str]) -> None:
    failed = await _failure(url)
    assert failed.kind is PageFailure.REFUSED
    assert "passwd" not in str(failed) and ":p@" not in str(failed)
    assert connects == []


async def test_a_redirect_to_another_scheme_is_refused(site: str) -> None:
    failed = await _failure(f"{site}/redirect?to={quote('file:///etc/passwd')}")
    assert failed.kind is PageFailure.REFUSED and "passwd" not in str(failed)


async def test_a_redirect_to_a_malformed_url_is_an_http_error(site: str) -> None:
    failed = await _failure(f"{site}/redirect?to={quote('http://xn--/x')}")
    assert failed.kind is PageFailure.HTTP_ERROR and str(failed) == "The exchange with '127.0.0.1' failed."


async def test_redirects_are_bounded(site: str) -> None:
    failed = await _failure(f"{site}/loop", max_redirects=3)
    assert failed.kind is PageFailure.HTTP_ERROR and "more than 3 times" in str(failed)


async def test_no_cookie_is_kept_not_even_across_one_redirect(site: str) -> None:
    page = await open_page(f"{site}/cookie-set", policy=_policy())
    assert page.lines == ("cookie header: []",)
    again = await open_page(f"{site}/cookie-echo", policy=_policy())
    assert again.lines == ("cookie header: []",)


# --- bounds and failures ----------------------------------------------------------------------


def _memory_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux 4.0+)


@pytest.mark.parametrize("path", ["/big", "/big-declared"])
async def test_a_50_mb_page_is_too_large_with_bounded_rss(site: str, path: str) -> None:
    cap = 2 * 1024 * 1024
    slack_kb = 24 * 1024
    await open_page(f"{site}/docs", policy=_policy())  # warm: imports, the site's first answers
    # the meter works: a 50 MB allocation shows in the peak (else the bound below could not fail)
    gc.collect()
    _reset_peak()
    before = _memory_kb("VmRSS")
    ballast = bytearray(50 * 1024 * 1024)
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    assert _memory_kb("VmHWM") - before > 40 * 1024
    del ballast
    gc.collect()
    _reset_peak()
    before = _memory_kb("VmRSS")
    failed = await _failure(f"{site}{path}", max_bytes=cap)
    growth_kb = _memory_kb("VmHWM") - before
    print(f"{path}: peak RSS growth {growth_kb} KiB for a {cap // 1024} KiB cap")
    assert failed.kind is PageFailure.TOO_LARGE
    assert str(failed) == f"The page at '127.0.0.1' is larger than {cap} bytes."
    assert growth_kb < cap // 1024 + slack_kb


async def test_a_page_that_never_finishes_times_out(site: str) -> None:
    failed = await _failure(f"{site}/trickle", timeout_s=1.0)
    assert failed.kind is PageFailure.TIMEOUT and str(failed) == "Reading the page at '127.0.0.1' timed out."


async def test_a_caller_that_gives_up_is_cancelled_not_answered_with_a_timeout(site: str) -> None:
    """The turn's own cancellation (its client went away) passes through: it is not a page failure."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(open_page(f"{site}/trickle", policy=_policy(), timeout_s=60), timeout=0.5)
    page = await open_page(f"{site}/news", policy=_policy())  # and the next open works
    assert "Ilse Brandt" in page.text


async def test_a_type_that_is_not_text_is_unsupported(site: str) -> None:
    failed = await _failure(f"{site}/image.png")
    assert failed.kind is PageFailure.UNSUPPORTED_TYPE and "'image/png'" in str(failed)


async def test_a_compressed_answer_is_unreadable_and_identity_was_asked(site: str) -> None:
    headers = await open_page(f"{site}/headers", policy=_policy())
    assert "accept-encoding: identity" in headers.lines
    assert "user-agent: Mozilla/5.0 (compatible; respgate web_search)" in headers.lines
    assert not any(line.startswith("cookie:") for line in headers.lines)
    failed = await _failure(f"{site}/gzip")
    assert failed.kind is PageFailure.UNREADABLE and "'gzip'-encoded" in str(failed)


async def test_an_error_status_is_an_http_error(site: str) -> None:
    failed = await _failure(f"{site}/missing")
    assert failed.kind is PageFailure.HTTP_ERROR and str(failed) == "The page at '127.0.0.1' answered HTTP 404."


async def test_nothing_listening_is_an_http_error(site: str) -> None:
    with running_app(site_app()) as gone:
        pass  # started and stopped: its port is closed now
    failed = await _failure(f"{gone}/news")
    assert failed.kind is PageFailure.HTTP_ERROR and "Could not connect to '127.0.0.1'" in str(failed)


# --- find -------------------------------------------------------------------------------------


def _page(*lines: str) -> Page:
    return Page(url="http://x.example/", title="t", text="\n".join(lines), lines=lines, content_type="text/plain")


def test_find_is_case_insensitive_and_shows_the_lines_after_each_match() -> None:
    page = _page("Alpha", "beta", "gamma ALPHA", "delta", "epsilon", "zeta", "alpha again", "eta")
    found = find(page, "alpha", show_lines=2)
    assert [(m.line, m.lines) for m in found] == [
        (0, ("Alpha", "beta")),
        (2, ("gamma ALPHA", "delta")),
        (6, ("alpha again", "eta")),
    ]
    assert found[1].numbered() == "L2: gamma ALPHA\nL3: delta"


def test_find_skips_the_lines_a_match_showed_and_is_bounded() -> None:
    page = _page(*(["needle"] * 100))
    found = find(page, "NEEDLE")
    assert [m.line for m in found] == list(range(0, 100, 4))  # 25: each shows 4 lines
    assert len(find(page, "needle", max_matches=3, show_lines=1)) == 3
    assert len(find(_page(*(["needle"] * 1000)), "needle", show_lines=1)) == 50


def test_find_with_no_match_or_an_empty_pattern_finds_nothing() -> None:
    page = _page("one", "two")
    assert find(page, "three") == [] and find(page, "") == [] and find(page, "   ") == []


async def test_find_in_an_opened_page_points_at_the_cited_line(site: str) -> None:
    page = await open_page(f"{site}/news", policy=_policy())
    (match,) = find(page, "ilse brandt")
    assert "Ilse Brandt" in page.lines[match.line]
    assert match.lines == page.lines[match.line : match.line + 4]
