"""The tool catalog against the real test MCP server: the server's own ``lists`` counter proves when
the catalog listed and when it served from memory. The clock is a test clock (no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.tools.catalog import ToolCatalog
from gateway.tools.mcp_client import McpClient, McpEndpoint, McpError
from tests.mcp_servers import Mode, ToolsServer, running_hostile, running_tools_server

TOKEN = "catalog-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ToolsServer]]:
    with running_tools_server(ToolsServer(token=TOKEN)) as pair:
        yield pair


@pytest.fixture
def clock() -> Clock:
    return Clock()


def catalog(clock: Clock, **kw: int) -> ToolCatalog:
    return ToolCatalog(McpClient(list_timeout=10, call_timeout=10), ttl=60, clock=clock, **kw)


def endpoint(url: str, token: str = TOKEN, label: str = "tools") -> McpEndpoint:
    return McpEndpoint(label, url, {"Authorization": f"Bearer {token}"})


async def test_a_hit_within_the_ttl_does_not_list_again(served: tuple[str, ToolsServer], clock: Clock) -> None:
    url, server = served
    cat = catalog(clock)
    lists = server.lists
    first = await cat.tools("t1", endpoint(url))
    clock.now += 59
    again = await cat.tools("t1", endpoint(url))
    assert again is first
    assert server.lists == lists + 1 and cat.listings == 1


async def test_an_expired_list_is_listed_again(served: tuple[str, ToolsServer], clock: Clock) -> None:
    url, server = served
    cat = catalog(clock)
    lists = server.lists
    first = await cat.tools("t1", endpoint(url))
    clock.now += 60
    again = await cat.tools("t1", endpoint(url))
    assert again == first and again is not first
    assert server.lists == lists + 2 and len(cat) == 1


async def test_tenants_do_not_share_lists(served: tuple[str, ToolsServer], clock: Clock) -> None:
    url, server = served
    cat = catalog(clock)
    lists = server.lists
    await cat.tools("t1", endpoint(url))
    await cat.tools("t2", endpoint(url))
    await cat.tools(None, endpoint(url))
    assert server.lists == lists + 3
    assert cat.held("t1") == cat.held("t2") == cat.held(None) == 1


async def test_one_tenant_cannot_evict_all_of_another(served: tuple[str, ToolsServer], clock: Clock) -> None:
    url, _ = served
    cat = catalog(clock, max_entries=4)
    await cat.tools("calm", endpoint(url))
    for n in range(8):  # distinct labels: distinct keys, all of the flooding tenant
        await cat.tools("flood", endpoint(url, label=f"s{n}"))
    assert cat.held("calm") == 1 and len(cat) == 4
    listings = cat.listings
    await cat.tools("calm", endpoint(url))
    assert cat.listings == listings  # still served from memory


async def test_credentials_separate_keys_and_are_never_kept_in_clear(
    served: tuple[str, ToolsServer], clock: Clock
) -> None:
    url, server = served
    cat = catalog(clock)
    other = "another-credential-98765"
    lists = server.lists
    await cat.tools("t1", endpoint(url))
    with pytest.raises(McpError, match="HTTP 401"):  # not served the list another credential got
        await cat.tools("t1", endpoint(url, token=other))
    await cat.tools("t1", McpEndpoint("tools", url, {"authorization": f"Bearer {TOKEN}"}))  # names: any case
    assert server.lists == lists + 1 and cat.listings == 2
    assert cat.key("t1", endpoint(url)) != cat.key("t1", endpoint(url, token=other))
    key = cat.key("t1", endpoint(url))
    assert TOKEN not in repr(key) and TOKEN.encode() not in key[3] and len(key[3]) == 16
    # a digest under this catalog's own random key: another catalog's key for the same headers differs
    assert catalog(clock).key("t1", endpoint(url)) != cat.key("t1", endpoint(url))


async def test_concurrent_lookups_share_one_listing(served: tuple[str, ToolsServer], clock: Clock) -> None:
    url, server = served
    cat = catalog(clock)
    lists = server.lists
    results = await asyncio.gather(*(cat.tools("t1", endpoint(url)) for _ in range(8)))
    assert all(result is results[0] for result in results)
    assert server.lists == lists + 1 and cat.listings == 1


async def test_a_failed_listing_reaches_every_waiter_and_is_not_cached(
    served: tuple[str, ToolsServer], clock: Clock
) -> None:
    url, server = served
    cat = catalog(clock)
    bad = endpoint(url, token="not-the-token-000")
    outcomes = await asyncio.gather(*(cat.tools("t1", bad) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(outcome, McpError) and "HTTP 401" in str(outcome) for outcome in outcomes)
    assert cat.listings == 1 and len(cat) == 0
    with pytest.raises(McpError):
        await cat.tools("t1", bad)
    assert cat.listings == 2  # tried again, not answered from a cached failure


async def test_the_last_waiter_gone_cancels_the_listing(clock: Clock) -> None:
    with running_hostile(Mode.SILENT) as (url, server):
        cat = ToolCatalog(McpClient(list_timeout=60), clock=clock)
        lookup = asyncio.ensure_future(cat.tools("t1", McpEndpoint("silent", url)))
        while server.requests == 0:
            await asyncio.sleep(0.01)
        lookup.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lookup
        for _ in range(500):  # the listing's connection is closed long before its 60 s timeout
            if server.closed:
                break
            await asyncio.sleep(0.01)
        assert server.closed >= 1 and not cat._flights


async def test_a_waiter_cancelled_leaves_the_others_their_answer(clock: Clock) -> None:
    with running_hostile(Mode.SILENT) as (url, server):
        cat = ToolCatalog(McpClient(list_timeout=0.5), clock=clock)
        first = asyncio.ensure_future(cat.tools("t1", McpEndpoint("silent", url)))
        second = asyncio.ensure_future(cat.tools("t1", McpEndpoint("silent", url)))
        while server.requests == 0:
            await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(McpError, match="no answer within 0.5 s"):
            await second
        assert first.cancelled() and cat.listings == 1
