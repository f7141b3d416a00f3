"""Full-history reuse (issue 15 item 6): a request with no parent renders only what follows the
longest prefix the tenant's earlier turns rendered (``gateway.turn.prefix``, ``cache.prefix_cache``).

Correctness first: every prompt built from the cache is compared token for token with the full
render of the same request, after random rollouts (outputs sampled canonically or not) and random
edits anywhere in the history (a character in an early item, a reorder, an insertion, a deletion,
another prelude, tenant or cache salt). Then the live gateway: a Codex-like and an AI SDK-like
``store: false`` loop whose engine prompts equal those of a gateway without the cache and whose
turns render only their new items; classifier skips with the flag still counted; tenant isolation;
the byte bounds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cache.item_log import ItemLog
from cache.prefix_cache import ENTRY_BYTES, TOKEN_BYTES, PrefixCache
from cache.seq import TokenSeq
from gateway.base.metrics import Metrics
from gateway.base.settings import Settings
from gateway.turn import render as render_stage
from gateway.turn.prefix import PrefixReuse
from gateway.turn.types import TurnInput
from gateway.wire.kinds import CALL_TYPES
from gateway.wire.request import CreateRequest
from inference.harmony import HarmonyRenderer
from inference.registry import ModelRoute
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine
from inference.simulated_prompt import PromptView
from inference.simulated_script import ToolCall, Turn
from security.flags import FlagReporter, MemoryFlagSink
from tests.conftest import MODEL
from tests.http_helpers import wait_for
from tests.inference import chat_template_support as cts
from tests.inference import harmony_support as hs
from tests.turn_helpers import render_tokens, ws_turn
from tests.ws_helpers import ws_open

PROPS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
BIG = 1 << 40


# -- the stage, driven as the pipeline drives it ----------------------------------------------------


class Harness:
    """``match`` (resolve) -> ``render`` (the render stage) -> the run stage's extension -> ``record``
    (the finalizer's hook), with the real stage code and a renderer; no server."""

    def __init__(self, renderer: Any, max_bytes: int = BIG, tenant_bytes: int = BIG) -> None:
        self.metrics = Metrics()
        self.cache = PrefixCache(max_bytes, tenant_bytes)
        self.reuse = PrefixReuse(self.cache, self.metrics)
        self.route = ModelRoute(name="m", engine=None, renderer=renderer, max_context=1 << 30)  # type: ignore[arg-type]
        self.renderer = renderer

    def turn(
        self,
        items: Sequence[dict],
        prelude: Prelude,
        tenant: str | None = None,
        salt: str | None = None,
        cached: bool = True,
    ) -> TurnInput:
        items = [dict(it) for it in items]
        calls = {it["call_id"]: it for it in items if it.get("type") in CALL_TYPES}
        body = {"model": "m", **({"cache_salt": salt} if salt else {})}
        prefix = self.reuse.match(items, calls, self.route, prelude, tenant, salt) if cached else None
        return TurnInput(
            req=CreateRequest.model_validate(body),
            route=self.route,
            tools=prelude.tools,
            prelude=prelude,
            parent=None,
            base_context=ItemLog(),
            new_items=tuple(items),
            input_items=tuple(items),
            new_calls=calls,
            pending_calls=frozenset(),
            compact_trigger=False,
            generate=True,
            store=False,
            prefix=prefix,
        )

    def prompt(self, turn: TurnInput) -> list[int]:
        r = render_stage.render(turn)
        return (r.base_ids.tolist() if r.base_ids is not None else []) + r.new_ids + r.gen_ids

    def full(
        self, items: Sequence[dict], prelude: Prelude, tenant: str | None = None, salt: str | None = None
    ) -> list[int]:
        return self.prompt(self.turn(items, prelude, tenant, salt, cached=False))

    def run(
        self, turn: TurnInput, tail: Sequence[int], outputs: int, flagged: bool = False, tenant: str | None = None
    ) -> TokenSeq:
        """The turn runs: its prompt is extended as ``gateway.turn.run`` does (in place at a tip) and
        ``tail`` (the generation prompt and the sampled tokens) appended; the hook records it."""
        rendered = render_stage.render(turn)
        base = rendered.base_ids
        turn_ids = base.extend(rendered.new_ids) if base is not None else TokenSeq(rendered.new_ids)
        history = turn_ids.extend(tail)
        prepared = SimpleNamespace(
            input=turn, rendered=rendered, flagged=flagged, id="resp_x", ctx=SimpleNamespace(tenant=tenant)
        )
        outcome = SimpleNamespace(compacted=None, history=history, output=[None] * outputs)
        state = SimpleNamespace(
            history_ids=history, root="resp_x", prefix_digest=turn.prefix.digest if turn.prefix else None
        )
        self.reuse.record(prepared, outcome, state)  # type: ignore[arg-type]
        return history

    def lookups(self, outcome: str) -> float:
        return self.metrics.registry.get_sample_value("respgate_prefix_cache_lookups_total", {"outcome": outcome}) or 0


def sampled_tail(
    h: Harness, outputs: Sequence[dict], canonical: bool, noise: int, calls: dict | None = None
) -> list[int]:
    """What a turn appends after its prompt: the outputs' canonical rendering (generation prompt
    included: harmony's ``<|start|>assistant…``), or — a real model's non-canonical tokens — that
    rendering with one token changed, or extra tokens."""
    tail = h.renderer.render_items(list(outputs), calls=calls) if outputs else list(h.renderer.generation_prompt())
    if not canonical:
        if tail and noise % 2:
            k = noise % len(tail)
            tail[k] = (tail[k] + 1) % 1000 + 1
        else:
            tail = tail + [17 + noise % 50]
    return tail


STRING_KEYS = ("text", "arguments", "output", "input")


def edit(items: list[dict], kind: str, pos: int, other: int) -> list[dict]:
    items = copy.deepcopy(items)
    if not items:
        return items
    pos %= len(items)
    if kind == "char":
        item = items[pos]
        holders = [item] + [p for k in ("content", "summary") if isinstance(item.get(k), list) for p in item[k]]
        for holder in holders:
            for key in STRING_KEYS:
                if isinstance(holder.get(key), str):
                    holder[key] = (
                        holder[key][: other % (len(holder[key]) + 1)]
                        + "§"
                        + holder[key][other % (len(holder[key]) + 1) :]
                    )
                    return items
        items[pos]["role" if "role" in items[pos] else "type"] = items[pos].get("role", "x")
    elif kind == "swap":
        j = other % len(items)
        items[pos], items[j] = items[j], items[pos]
    elif kind == "insert":
        items.insert(
            pos, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"new {other}"}]}
        )
    elif kind == "delete":
        del items[pos]
    return items


@st.composite
def rollouts(draw: st.DrawFn, conversations: Any) -> dict[str, Any]:
    """A conversation, the turns a client posts of it (each the whole history so far, the turn's
    output the next few items, sampled canonically or not), and one edit of the whole of it."""
    conv = draw(conversations)
    assume(len(conv) >= 2)
    turns = []
    end = draw(st.integers(1, len(conv)))
    while end <= len(conv) and len(turns) < 5:
        m = draw(st.integers(0, min(3, len(conv) - end)))
        turns.append((end, m, draw(st.booleans()), draw(st.integers(0, 99))))
        step = draw(st.integers(0, 3))
        end = end + m + step if step or m else end + 1
    return {
        "conv": conv,
        "turns": turns,
        "edit": draw(
            st.sampled_from(["none", "char", "char", "swap", "insert", "delete", "prelude", "tenant", "salt", "output"])
        ),
        "pos": draw(st.integers(0, 50)),
        "other": draw(st.integers(0, 50)),
    }


def check_rollout(h: Harness, case: dict[str, Any], prelude: Prelude, prelude2: Prelude) -> None:
    conv = case["conv"]
    calls = {it["call_id"]: it for it in conv if it.get("type") in CALL_TYPES}
    for end, m, canonical, noise in case["turns"]:
        items = conv[:end]
        try:
            full = h.full(items, prelude)
        except Exception:
            assume(False)
        turn = h.turn(items, prelude)
        assert h.prompt(turn) == full, "a cached prefix gave other tokens than a full render"
        h.run(turn, sampled_tail(h, conv[end : end + m], canonical, noise, turn.new_calls | calls), m)
    # the client's next request: everything, after an edit anywhere
    items, pre, tenant, salt = list(conv), prelude, None, None
    kind = case["edit"]
    if kind in ("char", "swap", "insert", "delete"):
        items = edit(items, kind, case["pos"], case["other"])
    elif kind == "prelude":
        pre = prelude2
    elif kind == "tenant":
        tenant = "someone-else"
    elif kind == "salt":
        salt = "another-salt"
    elif kind == "output":  # the last turn's outputs re-sent differently (an item dropped)
        end, m, _, _ = case["turns"][-1]
        if m:
            items = conv[:end] + conv[end + 1 :]
    try:
        full = h.full(items, pre, tenant, salt)
    except Exception:
        assume(False)
    before = h.lookups("hit")
    turn = h.turn(items, pre, tenant, salt)
    assert h.prompt(turn) == full, f"edit {kind!r}: a cached prefix gave other tokens than a full render"
    if kind in ("tenant", "salt") or (kind == "prelude" and pre != prelude):
        assert h.lookups("hit") == before, f"{kind}: another tenant/salt/prelude must never hit"


@pytest.fixture(scope="module")
def harmony() -> HarmonyRenderer:
    return HarmonyRenderer()


@PROPS
@given(case=rollouts(hs.CONVERSATIONS), prelude=hs.PRELUDES, prelude2=hs.PRELUDES)
def test_harmony_cached_prefix_is_token_exact_under_random_edits(harmony, case, prelude, prelude2):
    check_rollout(Harness(harmony), case, prelude, prelude2)


@pytest.fixture(scope="module")
def smollm2_renderer():
    from inference.chat_template_render import ChatTemplateRenderer
    from inference.model_assets import prepare_model

    return ChatTemplateRenderer(prepare_model("smollm2"))


@pytest.fixture(scope="module")
def qwen25_renderer(smollm2_renderer):
    from inference.chat_template_render import ChatTemplateRenderer

    return ChatTemplateRenderer(tokenizer=smollm2_renderer.tokenizer, chat_template=cts.QWEN25_TEMPLATE)


@pytest.fixture(params=["smollm2", "qwen25"])
def ct(request):
    return request.getfixturevalue(f"{request.param}_renderer")


CT_PRELUDES = st.sampled_from(
    [
        Prelude(tools=cts.ALL_TOOLS),
        Prelude(),
        Prelude(instructions="Be brief."),
        Prelude(tools=cts.ALL_TOOLS[:1], tool_choice="required"),
    ]
)


@settings(PROPS, max_examples=60)
@given(case=rollouts(cts.CONVERSATIONS), prelude=CT_PRELUDES, prelude2=CT_PRELUDES)
def test_chat_template_cached_prefix_is_token_exact_under_random_edits(ct, case, prelude, prelude2):
    check_rollout(Harness(ct), case, prelude, prelude2)


# -- spelled-out cases -------------------------------------------------------------------------------

TOOLS = (hs.GET_WEATHER,)
PRE = Prelude(tools=TOOLS)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(n: int, city: str = "Oslo") -> dict:
    return {
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": "get_weather",
        "arguments": json.dumps({"city": city}),
    }


def output(n: int, text: str = "sunny") -> dict:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": text}


def agent_loop(h: Harness, turns: int, canonical: bool = True) -> tuple[list[dict], list[TokenSeq]]:
    """A tool loop posting its whole history each turn; each turn's output one call."""
    items, histories = [user("weather in Oslo, then Bergen, then ...")], []
    for n in range(turns):
        turn = h.turn(items, PRE)
        assert h.prompt(turn) == h.full(items, PRE)
        outs = [call(n, f"city {n}")]
        histories.append(h.run(turn, sampled_tail(h, outs, canonical, n), len(outs)))
        items = items + outs + [output(n, f"result {n} " * 20)]
    return items, histories


def test_a_loop_appends_in_place_and_renders_only_its_new_items(harmony):
    h = Harness(harmony)
    items, histories = agent_loop(h, 8)
    assert h.lookups("miss") == 1 and h.lookups("hit") == 7
    # each turn extended the previous turn's history in place: one buffer, charged once
    assert all(a.shares_prefix_with(b) for a, b in zip(histories, histories[1:]))
    assert h.cache.nbytes == len(histories[-1]) * TOKEN_BYTES + 8 * ENTRY_BYTES
    # the next request renders the new tool output only; the call before it came from the cache
    turn = h.turn(items, PRE)
    rendered = render_stage.render(turn)
    assert rendered.base_ids is histories[-1]
    assert rendered.new_ids == harmony.render_items([items[-1]], calls={items[-2]["call_id"]: items[-2]})
    assert turn.prefix.seen == len(items) - 1 == turn.prefix.covered


def test_non_canonical_samples_are_not_reused_but_the_prompt_is(harmony):
    h = Harness(harmony)
    items, histories = agent_loop(h, 5, canonical=False)
    turn = h.turn(items, PRE)
    rendered = render_stage.render(turn)
    # the prompt prefix was copied out (the sampled tokens after it are not what a full render has);
    # the re-sent call is rendered (as a lead) and classified, the prefix before it is not
    assert rendered.base_ids is not None and not rendered.base_ids.shares_prefix_with(histories[-1])
    assert h.prompt(turn) == h.full(items, PRE)
    assert turn.prefix.seen == len(items) - 2 and turn.prefix.covered == len(items) - 1
    copied = h.metrics.registry.get_sample_value("respgate_prefix_cache_copied_tokens_total")
    assert copied and copied >= len(rendered.base_ids)


def test_ids_and_status_do_not_change_the_digest_everything_else_does(harmony):
    h = Harness(harmony)
    items, _ = agent_loop(h, 3)
    resent = [dict(it, id=f"x{i}", status="in_progress") for i, it in enumerate(items)]
    turn = h.turn(resent, PRE)
    assert turn.prefix.covered == len(items) - 1
    for k, key in ((1, "arguments"), (0, "role")):
        changed = copy.deepcopy(items)
        changed[k][key] = changed[k][key].replace('"', "'") if key == "arguments" else "developer"
        turn = h.turn(changed, PRE)
        assert turn.prefix.seen <= k and h.prompt(turn) == h.full(changed, PRE)


def test_a_changed_tool_schema_misses(harmony):
    h = Harness(harmony)
    items, _ = agent_loop(h, 3)
    schema = copy.deepcopy(hs.GET_WEATHER)
    schema["description"] = schema.get("description", "") + " (metric)"
    turn = h.turn(items, Prelude(tools=(schema,)))
    assert turn.prefix is not None and turn.prefix.ids is None
    assert h.prompt(turn) == h.full(items, Prelude(tools=(schema,)))


def test_shared_call_ids_are_not_cached(harmony):
    h = Harness(harmony)
    items = [user("hi"), call(1), output(1), call(1, "Bergen"), output(1, "rain")]
    assert h.turn(items, PRE).prefix is None
    assert h.lookups("ineligible") == 1


def test_another_tenant_never_hits(harmony):
    h = Harness(harmony)
    items, _ = agent_loop(h, 3)
    assert h.turn(items, PRE, tenant="b").prefix.ids is None
    assert h.turn(items, PRE).prefix.ids is not None
    assert h.cache.tenant_nbytes("b") == 0


# -- bounds ------------------------------------------------------------------------------------------


def test_cache_charges_a_shared_buffer_once_and_evicts_whole_conversations():
    cache = PrefixCache(max_bytes=10_000, tenant_bytes=6_000)
    a1 = TokenSeq(list(range(100)))
    e1 = cache.put("t", b"a1", a1, 100, 0, False)
    a2 = a1.extend(range(100))  # the next turn of the same conversation, in place
    cache.put("t", b"a2", a2, 200, 0, False, near=e1.chain)
    assert cache.nbytes == 200 * TOKEN_BYTES + 2 * ENTRY_BYTES and len(cache) == 2
    # other conversations of the same tenant push the least recently used one out, whole
    cache.touch(e1)
    for k in range(6):
        cache.put("t", f"b{k}".encode(), TokenSeq(list(range(300))), 300, 0, False)
        assert cache.tenant_nbytes("t") <= 6_000 and cache.nbytes <= 10_000
    assert cache.get("t", b"a1") is None and cache.get("t", b"a2") is None
    assert cache.evictions >= 1
    # the global bound across tenants
    for k in range(20):
        cache.put(f"u{k}", b"x", TokenSeq(list(range(500))), 500, 0, False)
        assert cache.nbytes <= 10_000
    assert cache.tenant_nbytes("t") == 0  # least recently used tenant's conversations went first
    # a conversation larger than a tenant's budget is not kept at all
    assert cache.put("big", b"y", TokenSeq(list(range(2_000))), 2_000, 0, False) is None
    assert cache.tenant_nbytes("big") == 0


def test_a_retry_replaces_its_entry():
    cache = PrefixCache(BIG, BIG)
    cache.put("t", b"k", TokenSeq([1, 2, 3]), 3, 0, False)
    cache.put("t", b"k", TokenSeq([1, 2, 3, 4]), 3, 1, True)
    assert len(cache) == 1 and cache.get("t", b"k").flagged
    assert cache.nbytes == 4 * TOKEN_BYTES + ENTRY_BYTES


# -- the live gateway --------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_loop(view: PromptView) -> Turn:
    """The model reasons, then calls the tool, every turn (the newest tool output in its reasoning)."""
    last = view.last
    said = last.text[:20] if last is not None else ""
    return Turn(
        reasoning=f"Checking the next city after {said!r}.", tool_calls=(ToolCall("get_weather", {"city": said}),)
    )


def post(client: httpx.Client, body: dict, key: str | None = None) -> dict:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = client.post("/responses", json=body, headers=headers)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def run_full_history(
    live: Any, turns: int, style: str = "codex", key: str | None = None, outputs: dict[int, str] | None = None
) -> list[dict[str, float]]:
    """A client that keeps the conversation and posts all of it every turn (``store: false``):
    ``codex`` re-sends the output items as received; ``aisdk`` as the AI SDK does without a store
    (reasoning dropped, the call re-sent without its id, arguments re-serialized)."""
    renderer = HarmonyRenderer()
    history: list[dict] = [{"role": "user", "content": "What is the weather? Ask city by city."}]
    per_turn = []
    with httpx.Client(base_url=live.base_url, timeout=60) as client:
        for n in range(turns):
            before = sum(render_tokens(live)), live.metric("respgate_classified_items_total")
            resp = post(client, {"model": MODEL, "input": history, "store": False, "tools": [WEATHER]}, key)
            per_turn.append(
                {
                    "rendered": sum(render_tokens(live)) - before[0],
                    "classified": live.metric("respgate_classified_items_total") - before[1],
                }
            )
            outs = resp["output"]
            if style == "aisdk":
                outs = [
                    {
                        "type": "function_call",
                        "call_id": o["call_id"],
                        "name": o["name"],
                        "arguments": json.dumps(json.loads(o["arguments"]), separators=(",", ":")),
                    }
                    for o in outs
                    if o["type"] == "function_call"
                ]
            fc = next(o for o in resp["output"] if o["type"] == "function_call")
            text = (outputs or {}).get(n, f"turn {n}: cloudy, {n} C, wind {n * 3} km/h. " * 5)
            new = [{"type": "function_call_output", "call_id": fc["call_id"], "output": text}]
            per_turn[-1]["new_tokens"] = len(renderer.render_items(new, calls={fc["call_id"]: fc}))
            per_turn[-1]["resent_tokens"] = len(renderer.render_items([dict(o) for o in outs] + new))
            history = history + outs + new
    return per_turn


def test_full_history_loop_renders_only_new_items_and_prompts_equal_a_full_render(make_gateway):
    live = make_gateway(engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    off = make_gateway(Settings(prefix_cache_bytes=0), engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    turns = run_full_history(live, 8)
    run_full_history(off, 8)
    # token-exact: the engine saw the same prompts as from a gateway that renders every turn in full
    assert live.engine.stats.prompts == off.engine.stats.prompts
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 7
    # turn 1 renders in full; every later turn renders the new tool output alone (the generation
    # prompt is not rendered), after checking the re-sent outputs against the sampled tokens
    assert turns[0]["rendered"] > 0
    for n, t in enumerate(turns[1:], 1):
        assert t["rendered"] == turns[n - 1]["new_tokens"], (n, t)
        assert t["classified"] == 1, (n, t)  # the tool output; the history and the model's output: seen
    assert live.metric("respgate_prefix_cache_copied_tokens_total") == 0
    assert live.metric("respgate_prefix_cache_checked_tokens_total") > 0
    full = off.metric("respgate_render_tokens_total", {"mode": "full"})
    assert full > 3 * sum(t["rendered"] for t in turns)
    # the engine's prefix cache sees one growing sequence: each prompt extends the last
    p = live.engine.stats.prompts
    assert all(b[: len(a)] == a for a, b in zip(p, p[1:]))
    print(
        f"\nfull-history loop, rendered tokens per turn: cache {[int(t['rendered']) for t in turns]}; "
        f"without {full:.0f} in all"
    )


def test_ai_sdk_style_resend_stays_exact_and_renders_what_it_changed(make_gateway):
    live = make_gateway(engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    off = make_gateway(Settings(prefix_cache_bytes=0), engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    turns = run_full_history(live, 6, style="aisdk")
    run_full_history(off, 6, style="aisdk")
    assert live.engine.stats.prompts == off.engine.stats.prompts
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 5
    # the re-sent call is not what the model sampled (its reasoning is gone): rendered with the new
    # output, after the prompt prefix copied out of the history
    for n, t in enumerate(turns[1:], 1):
        assert t["rendered"] == turns[n - 1]["resent_tokens"], (n, t)
        assert t["classified"] == 2, (n, t)
    assert live.metric("respgate_prefix_cache_copied_tokens_total") > 0


def test_a_flag_in_the_cached_prefix_still_counts_for_the_conversation(make_gateway):
    gh = "ghp_R8vT2kLm9QzX4wNb7YcJ3hFd6SaPe1GuK5oI"
    slack = "xoxb-2048-8173-Zt4Yq9Lm2Pw7Kr5N"
    live = make_gateway(engine=SimulatedEngine(script=tool_loop), flags=FlagReporter(MemoryFlagSink()))
    run_full_history(live, 5, outputs={0: f"token {gh}", 3: f"also {slack}"})
    records = live.gw.pipeline.flags.sink.records
    wait_for(lambda: live.gw.pipeline.flags.written == 2, what="two flag records")
    # each secret reported once (the first one was not re-classified on the turns that re-sent it),
    # and the second one knows the conversation was flagged before
    assert [(r.category, r.conversation_flagged_before) for r in records] == [
        ("github_token", False),
        ("slack_token", True),
    ]


def test_a_blocked_item_never_enters_the_cache(make_gateway):
    live = make_gateway(Settings(classifier_block=["github_token"]), engine=SimulatedEngine(script=tool_loop))
    body = {
        "model": MODEL,
        "store": False,
        "input": [{"role": "user", "content": "token ghp_R8vT2kLm9QzX4wNb7YcJ3hFd6SaPe1GuK5oI"}],
    }
    with httpx.Client(base_url=live.base_url, timeout=60) as client:
        for _ in range(2):
            r = client.post("/responses", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "content_policy_violation"
    assert live.metric("respgate_prefix_cache_entries") == 0
    assert live.metric("respgate_classified_items_total") == 2


def test_tenants_do_not_share_the_cache(make_gateway):
    live = make_gateway(Settings(api_keys=["acme:key-a", "globex:key-b"]), engine=SimulatedEngine(script=tool_loop))
    run_full_history(live, 3, key="key-a")
    hits = live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"})
    misses = live.metric("respgate_prefix_cache_lookups_total", {"outcome": "miss"})
    assert (hits, misses) == (2, 1)
    # the same conversation from another tenant: every turn's longest prefix is its own earlier turn
    run_full_history(live, 3, key="key-b")
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "miss"}) == misses + 1
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == hits + 2


def test_the_byte_bounds_hold_on_the_live_gateway(make_gateway):
    live = make_gateway(
        Settings(prefix_cache_bytes=20_000, prefix_cache_tenant_bytes=10_000), engine=SimulatedEngine(script=tool_loop)
    )
    for k in range(4):  # four conversations of ~1,000 tokens each, and their turns' entries
        run_full_history(live, 4, outputs={0: f"conversation {k} " * 200})
        assert live.metric("respgate_prefix_cache_bytes") <= 10_000
    assert live.metric("respgate_prefix_cache_evictions_total") >= 1
    assert live.metric("respgate_prefix_cache_entries") >= 1


def chained_then_resent(live: Any, turns: int, edit: int | None = None) -> dict[str, float]:
    """``turns`` tool-loop turns chained on a WebSocket (``store: false``), then the whole history
    sent once more over HTTP without a parent (as a Codex that lost its WebSocket does), the item
    at ``edit`` changed when given: the re-send's rendered tokens."""
    history: list[dict] = [{"role": "user", "content": "What is the weather? Ask city by city."}]
    prev, new = None, history
    with ws_open(live) as ws:
        for n in range(turns):
            resp = ws_turn(ws, MODEL, new, prev, tools=[WEATHER])
            fc = next(o for o in resp["output"] if o["type"] == "function_call")
            new = [{"type": "function_call_output", "call_id": fc["call_id"], "output": f"turn {n}: cloudy. " * 4}]
            history = history + resp["output"] + new
            prev = resp["id"]
    if edit is not None:
        history = copy.deepcopy(history)
        item = history[edit]
        if item.get("type") == "function_call_output":
            item["output"] += " (edited)"
        elif item.get("type") == "function_call":
            item["arguments"] = item["arguments"].replace('"', "'")
        elif item.get("type") == "reasoning":
            item["content"][0]["text"] += " (edited)"
        else:
            item["content"] = "edited"
    before = sum(render_tokens(live))
    with httpx.Client(base_url=live.base_url, timeout=60) as client:
        post(client, {"model": MODEL, "input": history, "store": False, "tools": [WEATHER]}, "test-key")
    return {"rendered": sum(render_tokens(live)) - before, "history": len(history)}


@pytest.mark.parametrize("edit", [None, 0, 1, 2, 3, 7, -1])
def test_chained_turns_leave_entries_a_full_history_resend_finds_token_exact(make_gateway, edit):
    """A chained turn's entry is named by the digest of its whole input (the parent's folded over
    its outputs and the new items): a full-history re-send of the chain renders only what follows
    the last turn, and a prompt equal, token for token, to a gateway's that renders it in full —
    also when an item anywhere in the history was changed (then the hit ends before it)."""
    live = make_gateway(engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    off = make_gateway(Settings(prefix_cache_bytes=0), engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    got = chained_then_resent(live, 4, edit)
    chained_then_resent(off, 4, edit)
    assert live.engine.stats.prompts[-1] == off.engine.stats.prompts[-1]  # token-exact
    # the first item changed: nothing of it was ever rendered (a miss, a full render)
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == (0 if edit == 0 else 1)
    if edit in (None, -1):  # the last tool output is new anyway: only it is rendered
        assert 0 < got["rendered"] < 60
    else:  # rendered from the edited item on: more than the new item alone
        assert got["rendered"] >= 60


@pytest.mark.parametrize("pooled", [False, True])
def test_a_chained_turns_digest_is_folded_after_its_terminal_unless_it_was_prepared_in_the_pool(make_gateway, pooled):
    """A small chained turn's digest is folded when its state is kept, after its terminal event
    (the resolver never hashes it); a turn prepared in the pool (every body here, with a zero
    inline budget) is hashed there. Either way the entry is named as a full-history re-send names
    it: the re-send finds it and renders only what follows."""
    settings = Settings(inline_prepare_bytes=0) if pooled else Settings()
    live = make_gateway(settings, engine=SimulatedEngine(record_prompts=True, script=tool_loop))
    resolver_prefix = live.gw.pipeline.resolver.prefix
    calls: list[int] = []
    extend = resolver_prefix.extend

    def spied(parent, new_items):
        calls.append(len(new_items))
        return extend(parent, new_items)

    resolver_prefix.extend = spied  # the resolver's calls only: the finalizer holds its own reference
    got = chained_then_resent(live, 3)
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 1
    assert 0 < got["rendered"] < 60
    assert (len(calls) == 2) if pooled else (calls == [])  # the two chained turns after the first


def test_a_fault_folding_the_digest_costs_the_entry_not_the_chain(make_gateway, caplog):
    live = make_gateway(engine=SimulatedEngine(record_prompts=True, script=tool_loop))

    def broken(parent, new_items):
        raise RuntimeError("digest bug")

    live.gw.pipeline.finalizer.chain_digest = broken
    with caplog.at_level("ERROR", logger="gateway.turn.finalize"):
        got = chained_then_resent(live, 3)  # every chained turn continued its parent
    # the re-send finds only the first turn's entry (it had no parent): what the chained turns
    # added is rendered again
    assert live.metric("respgate_prefix_cache_lookups_total", {"outcome": "hit"}) == 1
    assert got["rendered"] > 60
    assert any("leaves no prefix-cache entry" in r.getMessage() for r in caplog.records)


def test_an_http_store_true_chain_stores_the_digest_folded_before_its_write(make_gateway):
    """``store=true`` chained over HTTP (``previous_response_id``): the state is written before the
    terminal event, so the digest is folded there, and the stored state carries exactly what the
    fold at resolve would have given — the parent's digest over its outputs and the new items."""
    live = make_gateway(engine=SimulatedEngine(script=tool_loop))
    prefix, store = live.gw.pipeline.prefix, live.gw.pipeline.resolver.store
    ids: list[str] = []
    new: list[dict] = [{"role": "user", "content": "What is the weather? Ask city by city."}]
    with httpx.Client(base_url=live.base_url, timeout=60) as client:
        for n in range(3):
            body = {"model": MODEL, "input": new, "tools": [WEATHER], "store": True}
            if ids:
                body["previous_response_id"] = ids[-1]
            resp = post(client, body, "test-key")
            fc = next(o for o in resp["output"] if o["type"] == "function_call")
            ids.append(resp["id"])
            new = [{"type": "function_call_output", "call_id": fc["call_id"], "output": f"turn {n}: rain. " * 4}]
    states = [live.call(store.get(i)) for i in ids]
    assert all(s is not None and s.prefix_digest is not None for s in states)
    for parent, child in zip(states, states[1:]):  # a chained turn's input items are its new items
        assert child.prefix_digest == prefix.extend(parent, list(child.input_items))
