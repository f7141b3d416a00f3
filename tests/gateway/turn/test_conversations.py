"""The Conversations API (issue 16, item 2): stores, endpoints, conversation turns, real clients.

* **Stores** (memory and Redis, the same checks): CRUD, tenant isolation, cursor pagination,
  revisions, bounds in items and bytes (a turn's forced append crosses them, nothing else does),
  duplicate ids, expiry; Redis keys share one hash slot per conversation (Redis Cluster).
* **Endpoints** through the openai SDK's ``client.conversations.*`` against a live gateway, every
  object checked against the SDK's types with every declared field present; OpenAI's errors; one
  tenant's conversation is a 404 to another, byte for byte the answer for an unknown id.
* **Turns** (``conversation`` on a create, HTTP and WebSocket): the context starts with the
  conversation's items; the turn's input and output items are appended when it completes (not when
  it fails); a chained conversation turn on the process that ran the previous one appends to its
  rendered tokens (O(new input): counted per turn, and token-exact against a full render), while a
  conversation changed in between — or read by another replica — is rendered from its items.
* **Billing**: conversation turns are billed exactly once, failed ones included.
* **Real clients**: openai-agents' ``OpenAIConversationsSession`` (a multi-turn tool-using agent:
  the stored conversation equals what the agent sent and got) and ``Runner.run(conversation_id=)``
  (the server-side conversation path).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest
import redis
from openai.types.conversations.conversation import Conversation as SdkConversation
from openai.types.conversations.conversation_deleted_resource import ConversationDeletedResource
from openai.types.conversations.conversation_item import ConversationItem
from openai.types.conversations.conversation_item_list import ConversationItemList

from billing.usage import MemorySink
from cache.conversations import (
    ConversationFull,
    ConversationNotFound,
    DuplicateItem,
    Limits,
    MemoryConversationStore,
    UnknownCursor,
)
from cache.redis_conversations import RedisConversationStore
from gateway.base.settings import Settings
from inference.harmony import HarmonyRenderer
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn, turns_in_order
from tests.conftest import MODEL, LiveGateway
from tests.http_helpers import assert_error, post, stream, wait_for
from tests.schema_check import OpenResponses, _variants, sdk_check, sdk_check_event, sdk_check_response

pytestmark = pytest.mark.timeout(180)

ITEM_TYPES = _variants(ConversationItem)
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def check_item(item: dict[str, Any]) -> None:
    problems = sdk_check(item, ITEM_TYPES[item["type"]])
    assert not problems, problems


def check_list(body: dict[str, Any]) -> None:
    assert not sdk_check(body, ConversationItemList), sdk_check(body, ConversationItemList)
    for item in body["data"]:
        check_item(item)


def raw(
    live: LiveGateway, method: str, path: str, body: Any = None, key: str | None = None, params: Any = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, live.base_url + path, json=body, headers=headers, params=params, timeout=30)


def stored_items(live: LiveGateway, conversation_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
    store = live.gw.pipeline.conversations.store
    return live.call(store.items(conversation_id, tenant))[1]


def metric(live: LiveGateway, name: str, **labels: str) -> float:
    return live.metric(name, labels)


# ---------------------------------------------------------------------------------------------
# the stores
# ---------------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def make_store(request):
    made: list[Any] = []
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None

    def make(limits: Limits = Limits(), **kw: Any):
        store = (
            MemoryConversationStore(limits, **kw) if url is None else RedisConversationStore.from_url(url, limits, **kw)
        )
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["id"] for i in items]


async def test_store_crud_revisions_and_tenants(make_store):
    s = make_store()
    c = await s.create("conv_a", "acme", {"k": "v"}, [{"id": "m1", "n": 1}, {"id": "m2"}])
    assert (c.id, c.count, c.revision, c.metadata) == ("conv_a", 2, 0, {"k": "v"})
    # another tenant sees nothing, through every operation
    assert await s.get("conv_a", "beta") is None and await s.get("conv_a", None) is None
    for op in (
        s.items("conv_a", "beta"),
        s.append("conv_a", "beta", [{"id": "x"}]),
        s.page("conv_a", "beta", after=None, limit=5, order="asc"),
        s.item("conv_a", "beta", "m1"),
        s.delete_item("conv_a", "beta", "m1"),
    ):
        with pytest.raises(ConversationNotFound):
            await op
    assert await s.update("conv_a", "beta", {}) is None and not await s.delete("conv_a", "beta")
    # every change to the items moves the revision; metadata does not
    a = await s.append("conv_a", "acme", [{"id": "m3"}])
    assert (a.previous_revision, a.conversation.revision, a.conversation.count) == (0, 1, 3)
    assert (await s.update("conv_a", "acme", {"x": "y"})).revision == 1
    assert (await s.delete_item("conv_a", "acme", "m2")).revision == 2
    assert await s.delete_item("conv_a", "acme", "m2") is None
    conv, items = await s.items("conv_a", "acme")
    assert (conv.revision, conv.metadata, _ids(items)) == (2, {"x": "y"}, ["m1", "m3"])
    assert await s.item("conv_a", "acme", "m1") == {"id": "m1", "n": 1}
    assert await s.item("conv_a", "acme", "m2") is None
    assert await s.delete("conv_a", "acme")
    assert await s.get("conv_a", "acme") is None and not await s.delete("conv_a", "acme")


async def test_store_pagination_both_orders(make_store):
    s = make_store()
    await s.create("conv_p", None, {}, [{"id": f"m{i}"} for i in range(7)])
    await s.delete_item("conv_p", None, "m3")  # a hole: cursors skip it
    seen, after = [], None
    while True:
        page = await s.page("conv_p", None, after=after, limit=2, order="asc")
        seen += _ids(page.items)
        if not page.has_more:
            break
        after = page.items[-1]["id"]
    assert seen == ["m0", "m1", "m2", "m4", "m5", "m6"]
    page = await s.page("conv_p", None, after=None, limit=4, order="desc")
    assert (_ids(page.items), page.has_more) == (["m6", "m5", "m4", "m2"], True)
    page = await s.page("conv_p", None, after="m2", limit=4, order="desc")
    assert (_ids(page.items), page.has_more) == (["m1", "m0"], False)
    page = await s.page("conv_p", None, after="m6", limit=4, order="asc")
    assert (page.items, page.has_more) == ([], False)
    with pytest.raises(UnknownCursor):
        await s.page("conv_p", None, after="m3", limit=4, order="asc")


async def test_store_bounds_duplicates_and_forced_appends(make_store):
    s = make_store(Limits(max_items=4, max_bytes=200))
    with pytest.raises(ConversationFull):
        await s.create("conv_big", None, {}, [{"id": f"m{i}"} for i in range(5)])
    assert await s.get("conv_big", None) is None  # a refused create leaves nothing behind
    await s.create("conv_b", None, {}, [{"id": "m0"}])
    with pytest.raises(DuplicateItem):
        await s.append("conv_b", None, [{"id": "m1"}, {"id": "m1"}])
    with pytest.raises(DuplicateItem):
        await s.append("conv_b", None, [{"id": "m0"}])
    with pytest.raises(ConversationFull):  # bytes: one 250-byte item
        await s.append("conv_b", None, [{"id": "m1", "text": "x" * 250}])
    with pytest.raises(ConversationFull):  # items: four more
        await s.append("conv_b", None, [{"id": f"n{i}"} for i in range(4)])
    conv, items = await s.items("conv_b", None)
    assert (conv.revision, _ids(items)) == (0, ["m0"])  # refusals change nothing
    # a turn's append is forced: kept past the bounds, ids already present skipped
    a = await s.append("conv_b", None, [{"id": "m0"}, {"id": "t1", "text": "x" * 250}, {"id": "t2"}], force=True)
    assert _ids(list(a.items)) == ["t1", "t2"] and a.conversation.count == 3 and a.conversation.nbytes > 200
    with pytest.raises(ConversationFull):  # and then the conversation takes nothing more
        await s.append("conv_b", None, [{"id": "m9"}])
    deleted = await s.delete_item("conv_b", None, "t1")
    assert deleted.nbytes < 200 and deleted.count == 2
    await s.append("conv_b", None, [{"id": "m9"}])  # room again


async def test_memory_store_bounds_all_conversations_together_and_expires():
    probe = MemoryConversationStore(Limits())
    await probe.create("conv_0", None, {}, [{"id": "m0", "text": "x" * 600}])
    size = probe.nbytes  # what one such conversation is charged (its memory, not only its JSON)
    assert size > 600
    s = MemoryConversationStore(Limits(), max_total_bytes=4 * size + size // 2, ttl_s=3600)
    for i in range(6):
        await s.create(f"conv_{i}", None, {}, [{"id": f"m{i}", "text": "x" * 600}])
    assert s.nbytes <= s.max_total_bytes and len(s) == 4 and s.evictions == 2
    assert await s.get("conv_0", None) is None and await s.get("conv_5", None) is not None
    expired = MemoryConversationStore(Limits(), ttl_s=60)
    await expired.create("conv_x", None, {}, [])
    real = time.monotonic
    try:
        time.monotonic = lambda: real() + 61  # type: ignore[assignment]
        assert await expired.get("conv_x", None) is None and len(expired) == 0
    finally:
        time.monotonic = real  # type: ignore[assignment]


async def test_redis_keys_share_one_cluster_slot_and_expire_together(redis_url):
    from redis.crc import key_slot

    s = RedisConversationStore.from_url(redis_url, ttl_s=3600)
    await s.create("conv_slot", "acme", {}, [{"id": "m0"}])
    await s.append("conv_slot", "acme", [{"id": "m1"}])
    keys = sorted(k.decode() for k in redis.Redis.from_url(redis_url).keys("respgate:{conv:*"))
    assert len(keys) == 3 and {k.rsplit(":", 1)[1] for k in keys} == {"meta", "order", "items"}
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one slot: Cluster runs every script unchanged
    assert all(k.startswith("respgate:{conv:conv_slot}:") for k in keys)
    ttls = [redis.Redis.from_url(redis_url).pttl(k) for k in keys]
    assert all(3_500_000 < t <= 3_600_000 for t in ttls), ttls
    await s.close()


async def test_redis_store_down_is_unavailable_not_missing():
    from cache.response_store import StoreUnavailable
    from tests.conftest import free_port

    s = RedisConversationStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
    for op in (s.get("conv_a", None), s.items("conv_a", None), s.append("conv_a", None, [{"id": "m"}])):
        with pytest.raises(StoreUnavailable):
            await op
    await s.close()


# ---------------------------------------------------------------------------------------------
# the endpoints, through the SDK
# ---------------------------------------------------------------------------------------------


def test_every_endpoint_with_the_sdk_and_the_sdk_types(gateway):
    client = gateway.openai()
    conv = client.conversations.create(
        items=[user("Hello"), {"type": "message", "role": "assistant", "content": "Hi! How can I help?"}],
        metadata={"topic": "demo"},
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
    body = raw(gateway, "GET", f"/conversations/{conv.id}").json()
    assert body == {
        "id": conv.id,
        "object": "conversation",
        "created_at": conv.created_at,
        "metadata": {"topic": "demo"},
    }
    assert not sdk_check(body, SdkConversation)

    listed = raw(gateway, "GET", f"/conversations/{conv.id}/items", params={"order": "asc"}).json()
    check_list(listed)
    assert [(i["role"], i["content"][0]["text"]) for i in listed["data"]] == [
        ("user", "Hello"),
        ("assistant", "Hi! How can I help?"),
    ]
    assert all(i["id"].startswith("msg_") and i["status"] == "completed" for i in listed["data"])
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == (
        listed["data"][0]["id"],
        listed["data"][1]["id"],
        False,
    )

    added = client.conversations.items.create(
        conv.id,
        items=[
            user("Weather?"),
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "12C"}]},
            {"type": "message", "role": "user", "content": "Thanks", "id": "msg_mine"},
        ],
    )
    assert [i.type for i in added.data] == ["message", "function_call", "function_call_output", "message"]
    assert added.data[-1].id == "msg_mine"  # an item that has an id keeps it
    assert added.data[1].id.startswith("fc_") and added.data[2].id.startswith("fco_")
    check_list(raw(gateway, "GET", f"/conversations/{conv.id}/items").json())
    # a tool output's parts come back as its output, as sent
    out = raw(gateway, "GET", f"/conversations/{conv.id}/items/{added.data[2].id}").json()
    check_item(out)
    assert out["output"] == [{"type": "input_text", "text": "12C", "prompt_cache_breakpoint": None}]
    assert "output_parts" not in out

    got = client.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id)
    assert got.id == added.data[0].id and got.content[0].text == "Weather?"
    # the SDK's auto-pagination walks the cursors: 6 items, 2 per page, both orders
    asc = [i.id for i in client.conversations.items.list(conv.id, limit=2, order="asc")]
    desc = [i.id for i in client.conversations.items.list(conv.id, limit=2)]
    assert len(asc) == 6 and desc == asc[::-1]
    page = client.conversations.items.list(conv.id, limit=2, order="asc", after=asc[1])
    assert [i.id for i in page.data] == asc[2:4] and page.has_more

    after_delete = client.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    assert after_delete.id == conv.id and after_delete.object == "conversation"
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc")] == asc[:2] + asc[3:]

    updated = client.conversations.update(conv.id, metadata={"topic": "new", "n": "2"})
    assert updated.metadata == {"topic": "new", "n": "2"}
    assert raw(gateway, "POST", f"/conversations/{conv.id}", {"metadata": None}).json()["metadata"] == {}
    deleted = raw(gateway, "DELETE", f"/conversations/{conv.id}").json()
    assert deleted == {"id": conv.id, "object": "conversation.deleted", "deleted": True}
    assert not sdk_check(deleted, ConversationDeletedResource)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    assert metric(gateway, "respgate_conversation_store_seconds_count", op="page") >= 4


def test_items_by_reference_and_reasoning_from_a_stored_response(gateway):
    client = gateway.openai()
    resp = client.responses.create(model=MODEL, input="Say something.", include=["reasoning.encrypted_content"])
    reasoning = next(o for o in resp.output if o.type == "reasoning")
    message = next(o for o in resp.output if o.type == "message")
    conv = client.conversations.create()
    added = client.conversations.items.create(
        conv.id,
        items=[
            {"type": "item_reference", "id": message.id},
            # sealed reasoning as a stateless client keeps it: opened for the renderer
            {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content},
        ],
    )
    assert [i.id for i in added.data] == [message.id, reasoning.id]
    kept = stored_items(gateway, conv.id)
    assert kept[0]["content"] == message.model_dump()["content"]
    assert kept[1]["content"] == [{"type": "reasoning_text", "text": reasoning.content[0].text}]
    r = raw(gateway, "POST", f"/conversations/{conv.id}/items", {"items": [{"type": "item_reference", "id": "msg_x"}]})
    assert_error(r, 400, code="invalid_value", param="items[0].id")
    r = raw(
        gateway,
        "POST",
        f"/conversations/{conv.id}/items",
        {"items": [{"type": "reasoning", "summary": [], "encrypted_content": "forged"}]},
    )
    assert_error(r, 400, code="invalid_encrypted_content", param="items[0].encrypted_content")


def test_items_added_through_the_api_are_classified_once_as_they_enter(make_gateway):
    from tests.security.test_classifiers import GH_TOKEN, PEM

    live = make_gateway(Settings(classifier_block=["private_key"]))
    client = live.openai()
    r = raw(live, "POST", "/conversations", {"items": [user("fine"), user(f"my key:\n{PEM}")]})
    assert_error(r, 400, code="content_policy_violation", param="items[1]")
    assert PEM not in r.text
    conv = client.conversations.create()
    r = raw(live, "POST", f"/conversations/{conv.id}/items", {"items": [user(PEM)]})
    assert_error(r, 400, code="content_policy_violation", param="items[0]")
    assert list(client.conversations.items.list(conv.id)) == []  # a block adds nothing
    classified = metric(live, "respgate_classified_items_total")
    client.conversations.items.create(conv.id, items=[user(f"token {GH_TOKEN}")])  # a flag: added, reported
    sink = live.gw.pipeline.flags.sink  # the two blocks are in the review stream too, without the value
    wait_for(lambda: len(sink.records) == 3, what="three flag records")
    assert [(f.action, f.category, f.item_index, f.response_id) for f in sink.records] == [
        ("block", "private_key", 1, None),
        ("block", "private_key", 0, None),
        ("flag", "github_token", 0, None),
    ]
    assert metric(live, "respgate_classified_items_total") == classified + 1
    # a turn on the conversation classifies its own input only, not the items again
    client.responses.create(model=MODEL, input="next", conversation=conv.id)
    assert metric(live, "respgate_classified_items_total") == classified + 2


def test_request_errors_are_openais(gateway):
    r = raw(gateway, "POST", "/conversations", {"items": [user(str(i)) for i in range(21)]})
    assert_error(r, 400, code="array_above_max_length", param="items")
    assert_error(raw(gateway, "POST", "/conversations", {"nope": 1}), 400, code="unknown_parameter", param="nope")
    assert_error(
        raw(gateway, "POST", "/conversations", {"metadata": {f"k{i}": "v" for i in range(17)}}), 400, param="metadata"
    )
    assert_error(
        raw(gateway, "POST", "/conversations", {"items": [{"type": "message", "role": "user"}]}),
        400,
        param="items[0].content",
    )
    assert_error(
        raw(gateway, "POST", "/conversations", {"items": [{"type": "compaction_trigger"}]}), 400, param="items[0].type"
    )
    assert_error(raw(gateway, "POST", "/conversations", [1]), 400, code="invalid_type")
    conv = raw(gateway, "POST", "/conversations", {}).json()
    cid = conv["id"]
    assert_error(
        raw(gateway, "POST", f"/conversations/{cid}", {}), 400, code="missing_required_parameter", param="metadata"
    )
    assert_error(
        raw(gateway, "POST", f"/conversations/{cid}/items", {}), 400, code="missing_required_parameter", param="items"
    )
    r = raw(
        gateway,
        "POST",
        f"/conversations/{cid}/items",
        {"items": [user("a"), user("b") | {"id": "msg_1"}, user("c") | {"id": "msg_1"}]},
    )
    assert_error(r, 400, code="invalid_value", param="items")
    assert raw(gateway, "GET", f"/conversations/{cid}/items").json()["data"] == []  # refused whole
    for params, param in (
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"order": "up"}, "order"),
        ({"after": "msg_nope"}, "after"),
        ({"foo": "1"}, "foo"),
        ({"include": "nope"}, "include[0]"),
    ):
        assert_error(raw(gateway, "GET", f"/conversations/{cid}/items", params=params), 400, param=param)
    ok = raw(
        gateway,
        "GET",
        f"/conversations/{cid}/items",
        params=[("include[]", "message.output_text.logprobs"), ("limit", "100")],
    )
    assert ok.status_code == 200
    assert_error(
        raw(gateway, "GET", f"/conversations/{cid}/items/msg_nope"), 404, message="Item with id 'msg_nope' not found."
    )
    assert_error(raw(gateway, "DELETE", f"/conversations/{cid}/items/msg_nope"), 404)


def test_another_tenants_conversation_is_indistinguishable_from_a_missing_one(make_gateway):
    live = make_gateway(Settings(api_keys=["acme:key-acme", "beta:key-beta"], keys_file=None))
    acme, beta = live.openai(api_key="key-acme"), live.openai(api_key="key-beta")
    conv = acme.conversations.create(items=[user("acme's secret plan")])
    item_id = acme.conversations.items.list(conv.id).data[0].id
    missing = "conv_" + "0" * 48
    calls = [
        ("GET", "/conversations/{}", None),
        ("POST", "/conversations/{}", {"metadata": {}}),
        ("GET", "/conversations/{}/items", None),
        ("POST", "/conversations/{}/items", {"items": [user("x")]}),
        ("GET", "/conversations/{}/items/" + item_id, None),
        ("DELETE", "/conversations/{}/items/" + item_id, None),
        ("DELETE", "/conversations/{}", None),
    ]
    for method, path, body in calls:
        theirs = raw(live, method, path.format(conv.id), body, key="key-beta")
        unknown = raw(live, method, path.format(missing), body, key="key-beta")
        assert theirs.status_code == unknown.status_code == 404, (method, path, theirs.text)
        assert theirs.json() == json.loads(unknown.text.replace(missing, conv.id)), (method, path)
    # a turn on it is the same 404, on both transports; acme's conversation is untouched
    for cid in (conv.id, missing):
        r = raw(live, "POST", "/responses", {"model": MODEL, "input": "x", "conversation": cid}, key="key-beta")
        assert_error(r, 404, param="conversation", message=f"Conversation with id '{cid}' not found.")
    with beta.responses.connect() as ws:
        ws.response.create(model=MODEL, input="x", conversation=conv.id)
        ev = next(iter(ws))
        assert ev.type == "error" and ev.status == 404 and ev.error.param == "conversation"
    assert [i.id for i in acme.conversations.items.list(conv.id)] == [item_id]
    assert acme.conversations.retrieve(conv.id).id == conv.id
    with pytest.raises(openai.AuthenticationError):
        live.openai(api_key="wrong").conversations.retrieve(conv.id)


def test_bounds_through_the_api_and_a_turn_that_crosses_them(make_gateway):
    live = make_gateway(Settings(conversation_max_items=4, conversation_max_bytes=4096))
    client = live.openai()
    r = raw(live, "POST", "/conversations", {"items": [user(str(i)) for i in range(5)]})
    assert_error(r, 400, code="conversation_too_large", param="items")
    conv = client.conversations.create(items=[user("one"), user("two")])
    r = raw(live, "POST", f"/conversations/{conv.id}/items", {"items": [user("x" * 5000)]})
    assert_error(r, 400, code="conversation_too_large")
    # the turn's 3 items (input, reasoning, answer) take it to 5 > 4: kept whole
    resp = client.responses.create(model=MODEL, input="three", conversation=conv.id)
    assert resp.status == "completed"
    assert len(stored_items(live, conv.id)) == 5
    assert_error(
        raw(live, "POST", f"/conversations/{conv.id}/items", {"items": [user("six")]}),
        400,
        code="conversation_too_large",
    )


# ---------------------------------------------------------------------------------------------
# conversation turns
# ---------------------------------------------------------------------------------------------


def prompt_texts(engine: SimulatedEngine, i: int = -1) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in PromptView(engine.stats.prompts[i]).messages() if m.role != "system"]


def test_a_turn_reads_the_conversation_and_appends_its_items(gateway):
    client = gateway.openai()
    conv = client.conversations.create(
        items=[user("My name is Ada."), {"type": "message", "role": "assistant", "content": "Hello Ada."}]
    )
    before = [i.id for i in client.conversations.items.list(conv.id, order="asc")]
    resp = client.responses.create(model=MODEL, input="What is my name?", conversation=conv.id)
    assert resp.status == "completed" and resp.conversation.id == conv.id and resp.previous_response_id is None
    texts = prompt_texts(gateway.engine)
    assert texts[0] == ("user", "My name is Ada.") and ("user", "What is my name?") in texts
    assert ("assistant", "Hello Ada.") in texts
    after = list(client.conversations.items.list(conv.id, order="asc"))
    inputs = client.responses.input_items.list(resp.id).data
    assert [i.id for i in after] == before + [inputs[0].id] + [o.id for o in resp.output]
    assert after[2].content[0].text == "What is my name?"
    check_list(raw(gateway, "GET", f"/conversations/{conv.id}/items").json())
    # input_tokens counts the conversation's items too (and appends nothing)
    counted = client.responses.input_tokens.count(model=MODEL, input="Again?", conversation=conv.id)
    n_items = len(list(client.conversations.items.list(conv.id)))
    # the stored response echoes the conversation; {"id": ...} is the other accepted form
    assert client.responses.retrieve(resp.id).conversation.id == conv.id
    r2 = client.responses.create(model=MODEL, input="Again?", conversation={"id": conv.id}, store=False)
    assert r2.conversation.id == conv.id and r2.usage.input_tokens == counted.input_tokens
    assert n_items == len(after)
    assert len(list(client.conversations.items.list(conv.id))) == len(after) + 1 + len(r2.output)
    # a conversation turn's Response and events against both published schemas (conversation: {id})
    schemas = OpenResponses()
    body = post(gateway, {"model": MODEL, "input": "JSON?", "conversation": conv.id}).json()
    assert body["conversation"] == {"id": conv.id}
    assert not sdk_check_response(body) + schemas.response_errors(body)
    _, _, events = stream(gateway, input="SSE?", conversation={"id": conv.id})
    assert events[-1]["type"] == "response.completed" and events[0]["response"]["conversation"] == {"id": conv.id}
    for ev in events:
        assert not sdk_check_event(ev) + schemas.event_errors(ev), ev["type"]


def test_conversation_refusals(gateway):
    client = gateway.openai()
    conv = client.conversations.create()
    first = client.responses.create(model=MODEL, input="hi")
    r = post(gateway, {"model": MODEL, "input": "x", "previous_response_id": first.id, "conversation": conv.id})
    assert_error(r, 400, param="conversation")
    for bad in (7, ["conv_1"], True):
        assert_error(
            post(gateway, {"model": MODEL, "input": "x", "conversation": bad}),
            400,
            code="invalid_type",
            param="conversation",
        )
    assert_error(
        post(gateway, {"model": MODEL, "input": "x", "conversation": {"id": conv.id, "x": 1}}),
        400,
        code="unknown_parameter",
    )
    assert_error(
        post(gateway, {"model": MODEL, "input": "x", "conversation": "conv_missing"}), 404, param="conversation"
    )
    r = post(
        gateway, {"model": MODEL, "conversation": conv.id, "input": [{"type": "compaction", "encrypted_content": "x"}]}
    )
    assert_error(r, 400, code="unsupported_parameter", param="input[0]")
    assert list(client.conversations.items.list(conv.id)) == []  # nothing was appended by refusals


def test_a_failed_turn_appends_nothing_and_is_billed_once(make_gateway):
    sink = MemorySink()
    engine = SimulatedEngine(
        record_prompts=True, script=turns_in_order([Turn(text="fine"), Turn(text="broken", fail_after_tokens=3)])
    )
    live = make_gateway(engine=engine, usage_sink=sink)
    client = live.openai()
    conv = client.conversations.create()
    ok = client.responses.create(model=MODEL, input="one", conversation=conv.id)
    n = len(list(client.conversations.items.list(conv.id)))
    failed = client.responses.create(model=MODEL, input="two", conversation=conv.id)
    assert (ok.status, failed.status) == ("completed", "failed")
    assert len(list(client.conversations.items.list(conv.id))) == n  # the failed turn left no items
    third = client.responses.create(model=MODEL, input="three", conversation=conv.id)
    assert third.status == "completed"
    # the failed turn was not the tip: the third continued the first turn's tokens (an append)
    texts = prompt_texts(engine)
    assert ("user", "two") not in texts and ("user", "one") in texts
    assert metric(live, "respgate_conversation_turns_total", context="tip") == 2
    wait_for(lambda: len(sink.records) >= 3, what="three usage records")
    assert sorted(sink.records) == sorted([ok.id, failed.id, third.id])
    assert {r.status for r in sink.records.values()} == {"completed", "failed"}
    for resp in (ok, failed, third):
        assert sink.records[resp.id].input_tokens == resp.usage.input_tokens


def test_a_turn_whose_conversation_is_deleted_meanwhile_fails_and_is_billed_once(make_gateway):
    import threading

    sink = MemorySink()
    engine = SimulatedEngine(
        record_prompts=True, script=turns_in_order([Turn(text="word " * 60, delay_per_token_s=0.02)])
    )
    live = make_gateway(engine=engine, usage_sink=sink)
    client = live.openai()
    conv = client.conversations.create(items=[user("hello")])
    out: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: out.update(r=client.responses.create(model=MODEL, input="talk", conversation=conv.id))
    )
    worker.start()
    wait_for(lambda: engine.stats.running == 1, what="the turn generating")
    client.conversations.delete(conv.id)
    worker.join(60)
    resp = out["r"]
    assert resp.status == "failed" and "could not be added to its conversation" in resp.error.message
    assert client.responses.retrieve(resp.id).status == "failed"  # the stored state says so too
    assert metric(live, "respgate_conversation_append_failures_total") == 1
    wait_for(lambda: resp.id in sink.records, what="the usage record")
    assert len(sink.records) == 1 and sink.records[resp.id].status == "failed"
    assert sink.records[resp.id].output_tokens == resp.usage.output_tokens > 0


def _chat_plan(n: int) -> list[Turn]:
    return [Turn(reasoning=f"Thinking about {i}.", text=f"Answer {i}.") for i in range(n)]


def test_chained_conversation_turns_append_their_new_input_only(make_gateway):
    """O(new input): after the first turn each turn renders only its new item; the engine prompt is
    the previous prompt + its sampled tokens + the new item; and it equals a full render of the
    conversation's items (token-exact). Rendered tokens per turn are printed for the note."""
    n = 8
    engine = SimulatedEngine(record_prompts=True, script=turns_in_order(_chat_plan(n)))
    live = make_gateway(engine=engine)
    client = live.openai()
    renderer = HarmonyRenderer()
    prelude = Prelude(instructions="Be terse.", tools=tuple(TOOLS), tool_choice="auto", reasoning_effort=None)
    conv = client.conversations.create(items=[user("Background: the project is called Zephyr.")])
    rendered: list[tuple[str, float]] = []
    for i in range(n):
        items_before = stored_items(live, conv.id)
        full0 = metric(live, "respgate_render_tokens_total", mode="full")
        app0 = metric(live, "respgate_render_tokens_total", mode="append")
        resp = client.responses.create(
            model=MODEL, input=f"Question {i}", conversation=conv.id, instructions="Be terse.", tools=TOOLS
        )
        assert resp.status == "completed"
        full = metric(live, "respgate_render_tokens_total", mode="full") - full0
        app = metric(live, "respgate_render_tokens_total", mode="append") - app0
        prompt = engine.stats.prompts[i]
        new_ids = renderer.render_items(
            [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Question {i}"}]}]
        )
        # the append is exact: a full render of the conversation's items + the new one
        assert prompt == (
            renderer.render_prelude(prelude)
            + renderer.render_items(items_before)
            + new_ids
            + renderer.generation_prompt()
        ), f"turn {i}"
        assert resp.usage.input_tokens == len(prompt)
        if i == 0:
            assert (full, app) == (len(prompt) - len(renderer.generation_prompt()), 0)
            rendered.append(("full", full))
        else:
            assert (full, app) == (0, len(new_ids)), f"turn {i}"
            assert prompt[: len(engine.stats.prompts[i - 1])] == engine.stats.prompts[i - 1]
            assert resp.usage.input_tokens_details.cached_tokens > 0
            rendered.append(("append", app))
    assert metric(live, "respgate_conversation_turns_total", context="tip") == n - 1
    assert metric(live, "respgate_conversation_turns_total", context="items") == 1
    print(
        "\nconversation turns, rendered tokens per turn:",
        rendered,
        "prompt lengths:",
        [len(p) for p in engine.stats.prompts],
    )


def test_a_conversation_changed_between_turns_is_rendered_from_its_items(gateway):
    client = gateway.openai()
    conv = client.conversations.create()
    client.responses.create(model=MODEL, input="first", conversation=conv.id)
    client.conversations.items.create(conv.id, items=[user("a note added through the API")])
    fallbacks0 = metric(gateway, "respgate_render_full_fallbacks_total", reason="tokens_missing")
    client.responses.create(model=MODEL, input="second", conversation=conv.id)
    texts = prompt_texts(gateway.engine)
    assert ("user", "a note added through the API") in texts and texts.index(("user", "first")) < texts.index(
        ("user", "a note added through the API")
    ) < texts.index(("user", "second"))
    assert metric(gateway, "respgate_render_full_fallbacks_total", reason="tokens_missing") == fallbacks0 + 1
    assert metric(gateway, "respgate_conversation_turns_total", context="items") == 2
    # a deleted item is gone from the next turn's context, too
    note = next(
        i
        for i in client.conversations.items.list(conv.id)
        if i.type == "message" and i.content[0].text == "a note added through the API"
    )
    client.conversations.items.delete(note.id, conversation_id=conv.id)
    client.responses.create(model=MODEL, input="third", conversation=conv.id)
    assert ("user", "a note added through the API") not in prompt_texts(gateway.engine)
    assert metric(gateway, "respgate_conversation_turns_total", context="items") == 3
    client.responses.create(model=MODEL, input="fourth", conversation=conv.id)  # unchanged since: the tip
    assert metric(gateway, "respgate_conversation_turns_total", context="tip") == 1


def test_a_tool_loop_on_a_conversation_over_websocket_and_http(make_gateway):
    engine = SimulatedEngine(
        record_prompts=True,
        script=turns_in_order(
            [
                Turn(reasoning="Check the weather.", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)),
                Turn(text="It is 12C in Oslo."),
                Turn(reasoning="Again.", tool_calls=(ToolCall("get_weather", {"city": "Rome"}),)),
                Turn(text="Rome: 20C."),
            ]
        ),
    )
    live = make_gateway(engine=engine)
    client = live.openai()
    conv = client.conversations.create()
    with client.responses.connect() as ws:
        ws.response.create(model=MODEL, input="Weather in Oslo?", conversation=conv.id, tools=TOOLS)
        first = _ws_final(ws)
        call = next(o for o in first.output if o.type == "function_call")
        assert first.conversation.id == conv.id
        ws.response.create(
            model=MODEL,
            conversation=conv.id,
            tools=TOOLS,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12C"}],
        )
        second = _ws_final(ws)
        assert second.status == "completed" and "12C" in second.output_text
        # a user message while a call of the conversation is unanswered is refused, as in a chain
        ws.response.create(model=MODEL, conversation=conv.id, tools=TOOLS, input="Weather in Rome?")
        third = _ws_final(ws)
        call2 = next(o for o in third.output if o.type == "function_call")
        ws.response.create(model=MODEL, conversation=conv.id, tools=TOOLS, input="skip it")
        err = next(iter(ws))
        assert err.type == "error" and "No tool output found" in err.error.message
    # the same conversation goes on over HTTP in the same process: still the tip (an append)
    fourth = client.responses.create(
        model=MODEL,
        conversation=conv.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call2.call_id, "output": "20C"}],
    )
    assert fourth.status == "completed"
    assert metric(live, "respgate_conversation_turns_total", context="tip") == 4
    assert metric(live, "respgate_render_tokens_total", mode="full") == len(engine.stats.prompts[0]) - len(
        HarmonyRenderer().generation_prompt()
    )
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [i.type for i in items] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[2].call_id == call.call_id and items[3].output == "12C"


def _ws_final(ws) -> Any:
    for ev in ws:
        assert ev.type != "error", ev
        if ev.type in ("response.completed", "response.failed", "response.incomplete"):
            return ev.response
    raise AssertionError("socket closed")


def test_two_replicas_share_conversations_through_redis(make_gateway, redis_url, tmp_path):
    a = make_gateway(Settings(redis_url=redis_url, usage_journal=str(tmp_path / "a")))
    b = make_gateway(Settings(redis_url=redis_url, usage_journal=str(tmp_path / "b")))
    ca, cb = a.openai(), b.openai()
    conv = ca.conversations.create(items=[user("The code word is HELIOTROPE.")])
    r1 = ca.responses.create(model=MODEL, input="first", conversation=conv.id)
    # B has the items, not A's tokens: it renders them (once) and answers with the whole context
    r2 = cb.responses.create(model=MODEL, input="second", conversation=conv.id)
    assert ("user", "The code word is HELIOTROPE.") in prompt_texts(b.engine)
    assert metric(b, "respgate_conversation_turns_total", context="items") == 1
    assert metric(b, "respgate_render_full_fallbacks_total", reason="tokens_missing") == 1
    # A's tip is stale (B appended): A renders the items too, then continues its own tip
    ca.responses.create(model=MODEL, input="third", conversation=conv.id)
    ca.responses.create(model=MODEL, input="fourth", conversation=conv.id)
    assert metric(a, "respgate_conversation_turns_total", context="items") == 2
    assert metric(a, "respgate_conversation_turns_total", context="tip") == 1
    ids_a = [i.id for i in ca.conversations.items.list(conv.id, order="asc")]
    ids_b = [i.id for i in cb.conversations.items.list(conv.id, order="asc")]
    assert ids_a == ids_b and len(ids_a) == 1 + 4 * 3
    assert ids_a[4:7] == [client_input_id(cb, r2.id)] + [o.id for o in r2.output]
    assert r1.output[-1].id in ids_a
    cb.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        ca.conversations.retrieve(conv.id)
    assert_error(post(a, {"model": MODEL, "input": "x", "conversation": conv.id}), 404)


def client_input_id(client: Any, response_id: str) -> str:
    return client.responses.input_items.list(response_id).data[0].id


# ---------------------------------------------------------------------------------------------
# real clients: openai-agents
# ---------------------------------------------------------------------------------------------


def _weather_agent():
    from agents import Agent, function_tool

    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return f"{city}: 21C and sunny"

    agent = Agent(name="weather", instructions="Use the tool, then answer.", model=MODEL, tools=[get_weather])
    return agent, seen


def _answer_after_tool(view: PromptView) -> Turn | None:
    last = view.last
    if last is not None and last.role == "tool":
        return Turn(reasoning="The tool answered.", text=f"FINAL: {last.text.strip()}")
    if last is not None and last.role == "user":
        return Turn(reasoning="I need the tool.", tool_calls=(ToolCall("get_weather", {"city": last.text[-5:]}),))
    return None


def test_openai_agents_conversations_session_multi_turn_tool_agent(make_gateway):
    """Client-side history in a server-side conversation: each run reads the conversation, sends it
    as input, and adds what the run produced. The stored conversation must equal what the agent saw:
    the last model call's input (the session's history + the new item) plus that call's output."""
    from agents import OpenAIConversationsSession, Runner, set_tracing_disabled

    from tests.clients.test_real_clients import record_wire

    engine = SimulatedEngine(record_prompts=True, script=_answer_after_tool)
    live = make_gateway(engine=engine)
    wire = record_wire(live)
    agent, seen = _weather_agent()

    async def main() -> tuple[list[Any], list[dict[str, Any]], str]:
        from agents import set_default_openai_client

        set_tracing_disabled(True)
        client = openai.AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        session = OpenAIConversationsSession(openai_client=client)
        results = []
        for city in ("Oslo.", "Rome.", "Paris"):
            results.append(await Runner.run(agent, f"Weather in {city}", session=session))
        return results, await session.get_items(), session.session_id

    results, session_items, conversation_id = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen == ["Oslo.", "Rome.", "Paris"]
    assert [r.final_output for r in results] == [f"FINAL: {c}: 21C and sunny" for c in ("Oslo.", "Rome.", "Paris")]
    stored = stored_items(live, conversation_id)
    assert [i["type"] for i in stored] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ] * 3
    # what the agent saw on its last model call: its input, then the response's output
    creates = wire.http_bodies  # the bodies of POST /v1/responses
    assert len(creates) == 6 and all("conversation" not in c for c in creates)
    last_input = creates[-1]["input"]
    last_output = results[-1].raw_responses[-1].output
    saw = [_essence(i) for i in last_input] + [_essence(o.model_dump()) for o in last_output]
    assert [_essence(i) for i in stored] == saw
    assert [_essence(i) for i in session_items] == saw
    check_list(raw(live, "GET", f"/conversations/{conversation_id}/items", params={"limit": "100"}).json())


def _essence(item: dict[str, Any]) -> tuple[Any, ...]:
    """What the model sees of an item (ids, statuses and null fields aside)."""
    t = item.get("type", "message")
    if t == "message":
        content = item["content"]
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        return t, item["role"], text
    if t == "reasoning":
        return t, "".join(p["text"] for p in item.get("content") or [])
    if t == "function_call":
        return t, item["call_id"], item["name"], json.loads(item["arguments"])
    if t == "function_call_output":
        out = item["output"]
        return t, item["call_id"], out if isinstance(out, str) else "".join(p.get("text", "") for p in out)
    return (t,)


def test_openai_agents_runner_on_a_server_side_conversation(make_gateway):
    """``Runner.run(conversation_id=...)``: the agent sends only new items with ``conversation``; the
    gateway keeps the history, and every model call after the first appends to its tokens."""
    from agents import Runner, set_tracing_disabled

    from tests.clients.test_real_clients import record_wire

    engine = SimulatedEngine(record_prompts=True, script=_answer_after_tool)
    live = make_gateway(engine=engine)
    wire = record_wire(live)
    agent, seen = _weather_agent()
    conv = live.openai().conversations.create()

    async def main() -> list[Any]:
        set_tracing_disabled(True)
        from agents import set_default_openai_client

        set_default_openai_client(
            openai.AsyncOpenAI(base_url=live.base_url, api_key="test-key", max_retries=0), use_for_tracing=False
        )
        return [await Runner.run(agent, f"Weather in {c}", conversation_id=conv.id) for c in ("Oslo.", "Rome.")]

    results = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen == ["Oslo.", "Rome."] and results[-1].final_output == "FINAL: Rome.: 21C and sunny"
    creates = wire.http_bodies  # the bodies of POST /v1/responses
    assert len(creates) == 4 and all(c["conversation"] == conv.id for c in creates)
    assert [[i.get("type", "message") for i in c["input"]] for c in creates] == [
        ["message"],
        ["function_call_output"],
        ["message"],
        ["function_call_output"],
    ]
    # one full render (the first call), then appends only
    assert metric(live, "respgate_conversation_turns_total", context="tip") == 3
    assert metric(live, "respgate_render_tokens_total", mode="full") == len(engine.stats.prompts[0]) - len(
        HarmonyRenderer().generation_prompt()
    )
    for i in range(1, 4):
        assert engine.stats.prompts[i][: len(engine.stats.prompts[i - 1])] == engine.stats.prompts[i - 1]
    stored = stored_items(live, conv.id)
    assert [i["type"] for i in stored] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ] * 2
    # the stored conversation is exactly what the model was prompted with, then its last output
    texts = [
        (m.role, m.text)
        for m in PromptView(engine.stats.prompts[-1]).messages()
        if m.role not in ("system", "developer")
    ]
    assert [t for t in texts if t[0] == "user"] == [("user", "Weather in Oslo."), ("user", "Weather in Rome.")]
