"""Input items checked once per tenant and exact JSON (``gateway.turn.checks.ItemChecks``).

A request that re-sends its conversation (no ``previous_response_id``) takes the checked form of
every item it sent before. Property: over random conversations re-sent with random edits, the
items (and every refusal) are what a resolver that keeps nothing gives — ids the gateway gives
items sent without one are fresh each turn — and the kept items are never changed by the turns
that use them.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

from cache.item_log import ItemLog
from gateway.transport.services import GatewayState
from gateway.turn.checks import ItemChecks
from gateway.turn.resolve import Resolver
from gateway.wire.errors import ApiError
from tests.conftest import MODEL, gateway_state


def _resolver(gw: GatewayState) -> Resolver:
    p = gw.pipeline
    return Resolver(p.registry, p.resolver.store, p.metrics, p.resolver.sealer, p.compactor, p.finalizer.wait_for)


def _resolve(resolver: Resolver, body: dict[str, Any], tenant: str | None = "t") -> Any:
    body = orjson.loads(orjson.dumps(body))  # a parsed request: fresh objects, as the transport hands over
    try:
        req, raw_items, _, _, seen = resolver._validate(body, "http", tenant)
        items, calls = resolver._new_items(raw_items, ItemLog(), {}, seen, tenant)
    except ApiError as err:
        return ("error", err.status, err.code, err.param, err.message)
    return items, body["input"]


def _normalized(result: Any) -> Any:
    """Items with the ids the gateway gave (those the raw item did not carry) blanked."""
    if isinstance(result, tuple) and result and result[0] == "error":
        return result
    items, raw = result
    out = []
    for item, sent in zip(items, raw):
        sent_id = sent.get("id") if isinstance(sent, dict) else None
        out.append({k: ("<given>" if k == "id" and sent_id is None else v) for k, v in item.items()})
    return out


def _conversation(rng: random.Random, resolver: Resolver, n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "developer", "content": "You are a coding agent."}]
    for k in range(n):
        kind = rng.choice(["user", "assistant", "call", "reasoning", "custom"])
        with_id = rng.random() < 0.5
        if kind == "user":
            content = rng.choice([f"do {k}", [{"type": "input_text", "text": f"do {k}"}]])
            items.append({"role": "user", "content": content})
        elif kind == "assistant":
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    **({"id": f"msg_{k}"} if with_id else {}),
                    "content": [{"type": "output_text", "text": f"done {k}", "annotations": []}],
                }
            )
        elif kind == "reasoning":
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{k}",
                    "summary": [],
                    "encrypted_content": resolver.sealer.seal(f"thinking about {k}"),
                }
            )
        elif kind == "custom":
            items.append({"type": "custom_tool_call", "call_id": f"ct_{k}", "name": "apply_patch", "input": f"*** {k}"})
            items.append({"type": "custom_tool_call_output", "call_id": f"ct_{k}", "output": f"patched {k}"})
        else:
            items.append(
                {
                    "type": "function_call",
                    **({"id": f"fc_{k}"} if with_id else {}),
                    "call_id": f"c_{k}",
                    "name": "shell",
                    "arguments": orjson.dumps({"cmd": f"ls {k}"}).decode(),
                }
            )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": f"c_{k}",
                    "output": rng.choice([f"out {k}", [{"type": "input_text", "text": f"out {k}"}]]),
                }
            )
    return items


def _edit(rng: random.Random, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = [dict(it) for it in items]
    for _ in range(rng.randint(0, 2)):
        i = rng.randrange(len(items))
        how = rng.choice(["text", "drop", "dup", "bad", "tamper", "order"])
        it = items[i]
        if how == "text" and isinstance(it.get("content"), str):
            it["content"] += "!"
        elif how == "text" and isinstance(it.get("output"), str):
            it["output"] += "!"
        elif how == "drop" and len(items) > 2:
            items.pop(i)
        elif how == "dup":
            items.insert(i, dict(it))
        elif how == "bad":
            it["status"] = 7  # a wrong type: refused
        elif how == "tamper" and "encrypted_content" in it:
            it["encrypted_content"] = it["encrypted_content"][:-4] + "AAAA"
        elif how == "order":
            items[i] = dict(reversed(list(it.items())))  # the same item, other JSON: checked as new
    return items


def test_resent_conversations_resolve_as_without_the_checks(gw: GatewayState):
    rng = random.Random(21)
    kept, fresh = _resolver(gw), _resolver(gw)
    fresh.item_checks = ItemChecks(0)  # off: the path without the checks
    for _ in range(6):
        history = _conversation(rng, kept, 12)
        for n in range(2, len(history) + 1, 2):  # the conversation grows, re-sent whole each turn
            sent = _edit(rng, history[:n]) if rng.random() < 0.4 else history[:n]
            body = {"model": MODEL, "store": False, "input": sent}
            a, b = _resolve(kept, body), _resolve(fresh, body)
            assert _normalized(a) == _normalized(b)
    assert kept.item_checks.lru.hits > 200


def test_ids_given_by_the_gateway_are_fresh_each_turn_and_kept_items_never_change(gw: GatewayState):
    resolver = _resolver(gw)
    history = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": resolver.sealer.seal("why")},
    ]
    body = {"model": MODEL, "store": False, "input": history}
    first, _ = _resolve(resolver, body)
    second, _ = _resolve(resolver, body)
    assert resolver.item_checks.lru.hits == len(history)
    for a, b in zip(first, second):
        if "id" in a and a["id"] != "rs_1":
            assert a["id"] != b["id"] and a["id"].split("_")[0] == b["id"].split("_")[0]
        assert {k: v for k, v in a.items() if k != "id"} == {k: v for k, v in b.items() if k != "id"}
    assert second[3]["content"] == [{"type": "reasoning_text", "text": "why"}]  # unsealed, from the check
    for item in second:  # a turn changing its items leaves the kept ones as they were
        item["status"] = "changed"
        item.pop("content", None)
    third, _ = _resolve(resolver, body)
    assert [{k: v for k, v in t.items() if k != "id"} for t in third] == [
        {k: v for k, v in f.items() if k != "id"} for f in first
    ]


def test_only_requests_that_resend_their_conversation_use_the_checks(gw: GatewayState):
    resolver = _resolver(gw)
    items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    _resolve(resolver, {"model": MODEL, "input": items})
    _resolve(resolver, {"model": MODEL, "input": items}, tenant="other")
    assert resolver.item_checks.lru.hits == 0 and len(resolver.item_checks.lru) == 4  # per tenant
    _resolve(resolver, {"model": MODEL, "input": items[:1]})  # one item: a continuation's shape
    assert resolver.item_checks.lru.hits == 0
    chained = {"model": MODEL, "input": items, "previous_response_id": "resp_x"}
    assert resolver._validate(chained, "http", "t")[4] is None
    assert resolver._validate({"model": MODEL, "input": items, "conversation": "conv_x"}, "http", "t")[4] is None
    assert resolver._validate({"model": MODEL, "input": items}, "http", "t")[4] is not None


def test_kept_digests_are_the_digests_of_the_items(gw: GatewayState):
    """The prefix digests of a re-sent conversation, from the links kept with the checks, equal
    those computed from the items (``gateway.turn.prefix.digests``); a link is used only for the
    very item object it was found for."""
    from gateway.turn.prefix import digests, item_digest

    rng = random.Random(4)
    resolver = _resolver(gw)
    history = _conversation(rng, resolver, 10)
    for n in (4, len(history)):
        body = orjson.loads(orjson.dumps({"model": MODEL, "input": history[:n]}))
        _, raw_items, _, _, seen = resolver._validate(body, "http", "t")
        items, _ = resolver._new_items(raw_items, ItemLog(), {}, seen, "t")
        assert digests(b"d0", items, seen.digests) == digests(b"d0", items)
    assert len(seen.digests) >= 4
    item, link = next(iter(seen.digests.values()))
    assert link == item_digest(item)
    assert digests(b"d0", [dict(item)], seen.digests) == digests(b"d0", [item])  # an equal copy: computed
    forged = {id(dict(item)): (dict(item), b"x" * 16)}
    assert digests(b"d0", [item], forged) == digests(b"d0", [item])  # another object's entry: not used


def test_off_keeps_and_looks_up_nothing():
    from gateway.base.settings import Settings

    resolver = gateway_state(Settings(item_checks_bytes=0)).pipeline.resolver
    items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    for _ in range(2):
        assert resolver._validate({"model": MODEL, "input": items}, "http", None)[4] is None
    assert len(resolver.item_checks.lru) == 0 and resolver.item_checks.lru.misses == 0
