"""Continuations after a cut-off parent append (``gateway.turn.render``, *Cut-off parents append*).

Per model family — harmony, and each chat-template profile the repo ships (SmolLM2's own template,
Qwen2.5's on the same tokenizer) — a canonical completion is cut at a random token (inside
reasoning, text, tool-call arguments, a header, or between messages) and the cut history is
checked against what the docstring states:

* it is the parent's tokens verbatim + the format's closing tokens (harmony: ``<|end|>``, or
  ``<|call|>`` in a call; a header without content is dropped), and the prompt the next turn
  builds on it — prelude, history, the new items, a user message or a ``function_call_output`` —
  decodes to a well-formed conversation;
* it equals a full render of the same items exactly where the docstring says (both directions
  where the condition is decidable: the cut text's tokens are the tokenizer's own), and differs
  where it says it deliberately does (a chat template's cut ``<tool_call>``, dropped reasoning).

Then the gateway: rollouts with ``max_output_tokens=16`` over WebSocket and over HTTP with
``previous_response_id`` append on every turn — no full-render fallback, the rendered tokens of a
turn are exactly its new items', and the engine's prompt is the previous prompt + the sampled
tokens + the closing token + the new items.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.base.settings import Settings
from inference.engine import SamplingParams
from inference.harmony import HarmonyRenderer, harmony_encoding, harmony_tokens
from inference.renderer import Prelude
from inference.simulated import SimulatedEngine
from inference.simulated_script import ToolCall, Turn
from tests.conftest import MODEL
from tests.http_helpers import create
from tests.inference import chat_template_support as cts
from tests.inference import harmony_support as hs
from tests.turn_helpers import TokenScriptEngine, full_render_fallbacks

PROPS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
CALL_TYPES = ("function_call", "custom_tool_call")


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


#: the conversation before the cut turn: a finished tool round, so a new item may answer its call
CALL_PREV = {"type": "function_call", "call_id": "call_prev", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
CONTEXT = [
    user("What is the weather in Oslo?"),
    CALL_PREV,
    {"type": "function_call_output", "call_id": "call_prev", "output": "sunny, 21 C"},
]


def new_items(texts: st.SearchStrategy[str]) -> st.SearchStrategy[list[dict]]:
    """What a client sends after a cut turn: user messages and/or a (late) tool output."""
    one = st.one_of(
        texts.map(user), texts.map(lambda t: {"type": "function_call_output", "call_id": "call_prev", "output": t})
    )
    return st.lists(one, min_size=1, max_size=2)


def parsed_text(item: dict) -> str:
    if item["type"] == "function_call":
        return item["arguments"]
    if item["type"] == "custom_tool_call":
        return item["input"]
    return item["content"][0]["text"]


# -- harmony -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harmony() -> HarmonyRenderer:
    return HarmonyRenderer()


H_PRELUDE = Prelude(tools=hs.ALL_TOOLS)


def harmony_cut(r: HarmonyRenderer, outputs: list[dict], p: int) -> dict[str, Any]:
    """Where position ``p`` of ``gen + S`` (S: the canonical completion of ``outputs``) falls, and
    what the docstring says the cut history is: ``{region, expected, item, content}``."""
    enc, tok = harmony_encoding(), harmony_tokens()
    whole = r.generation_prompt() + render_completion_of(r, outputs)
    start = 0
    for item, msg in zip(outputs, r.item_messages(outputs)):
        m = enc.render(msg)
        if p < start + len(m):
            o = p - start
            if o == 0:
                return {"region": "between", "expected": whole[:p]}
            mi = m.index(tok.message)
            if o <= mi:  # <|message|> not sampled yet: a header
                return {
                    "region": "first_header" if start == 0 else "header",
                    "expected": [] if start == 0 else whole[:start],
                }
            closing = tok.call if item["type"] in CALL_TYPES else tok.end
            return {
                "region": item["type"],
                "item": item,
                "expected": whole[:p] + [closing],
                "content": whole[start + mi + 1 : p],
            }
        start += len(m)
    raise AssertionError("p past the completion")


def render_completion_of(r: HarmonyRenderer, outputs: list[dict]) -> list[int]:
    from inference.harmony import render_completion

    return render_completion(r.item_messages(outputs))


def harmony_parse(r: HarmonyRenderer, sampled: Sequence[int]) -> list[dict]:
    parser = r.parser(H_PRELUDE)
    return hs.items_from_events(parser.feed(list(sampled)) + parser.finish())


def harmony_appended(r: HarmonyRenderer, sampled: list[int]) -> list[int]:
    kept = r.cut_history(sampled)
    return [] if kept is None else r.generation_prompt() + kept


def check_harmony_conversation(r: HarmonyRenderer, history: list[int], new: list[dict]) -> None:
    """prelude + context + cut history + new items parse as harmony messages, the new ones last."""
    enc = harmony_encoding()
    calls = hs.call_index(CONTEXT)
    tokens = r.render_prelude(H_PRELUDE) + r.render_items(CONTEXT) + history + r.render_items(new, calls=calls)
    got = enc.parse_messages_from_completion_tokens(tokens, None)
    want_new = r.item_messages(new, calls)
    n_before = len(r.prelude_messages(H_PRELUDE)) + len(r.item_messages(CONTEXT))
    assert len(got) == n_before + history.count(harmony_tokens().start) + len(want_new)
    for g, w in zip(got[len(got) - len(want_new) :], want_new):
        assert (g.author.role, g.channel, g.recipient) == (w.author.role, w.channel, w.recipient)
        assert [c.text for c in g.content] == [c.text for c in w.content]
    for g in got[n_before : len(got) - len(want_new)]:  # the parent's own messages: the model's
        assert g.author.role.value == "assistant"


@st.composite
def harmony_cases(draw: st.DrawFn) -> tuple[list[dict], int, list[dict]]:
    r = _HARMONY
    outputs = draw(hs.model_outputs())
    n = len(r.generation_prompt()) + len(render_completion_of(r, outputs))
    region = draw(
        st.sampled_from(
            ["between", "first_header", "header", "reasoning", "message", "function_call", "custom_tool_call"]
        )
    )
    # cut anywhere before the final stop token (a cut after it is no cut)
    candidates = [p for p in range(3, n) if harmony_cut(r, outputs, p)["region"] == region]
    assume(candidates)
    return outputs, draw(st.sampled_from(candidates)), draw(new_items(hs.TEXT))


_HARMONY = HarmonyRenderer()


@PROPS
@given(case=harmony_cases())
def test_harmony_cut_history_appends(harmony: HarmonyRenderer, case: tuple[list[dict], int, list[dict]]) -> None:
    outputs, p, new = case
    r, enc = harmony, harmony_encoding()
    sampled = render_completion_of(r, outputs)[: p - len(r.generation_prompt())]
    cut = harmony_cut(r, outputs, p)
    appended = harmony_appended(r, sampled)
    # the parent's tokens verbatim + the closing token (or less an unfinished header)
    assert appended == cut["expected"]
    check_harmony_conversation(r, appended, new)
    parsed = harmony_parse(r, sampled)
    full = r.render_items(parsed)
    if cut["region"] in ("between", "first_header", "header"):
        assert appended == full
    else:  # in content: equal exactly when the cut text's tokens are the tokenizer's own
        assert parsed[-1].get("incomplete") and parsed[-1]["type"] == cut["item"]["type"]
        reproduced = enc.encode(parsed_text(parsed[-1]), disallowed_special=()) == cut["content"]
        assert (appended == full) == reproduced
    if appended == full:  # and then the whole next prompt is the full render of the same items
        calls = hs.call_index(CONTEXT)
        assert r.render_items(CONTEXT) + appended + r.render_items(new, calls=calls) == r.render_items(
            CONTEXT + parsed + new
        )


def test_harmony_cut_examples(harmony: HarmonyRenderer) -> None:
    """One cut per region, spelled out (the property test draws regions at random)."""
    r, enc = harmony, harmony_encoding()

    def cut(text: str) -> str | None:
        kept = r.cut_history(enc.encode(text, allowed_special="all"))
        return None if kept is None else enc.decode(kept)

    analysis = "<|channel|>analysis<|message|>Need the weather"
    assert cut(analysis) == analysis + "<|end|>"
    assert cut("<|channel|>final<|message|>Hello wor") == "<|channel|>final<|message|>Hello wor<|end|>"
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Os'
    assert cut(f"{analysis}.<|end|><|start|>assistant{call}") == f"{analysis}.<|end|><|start|>assistant{call}<|call|>"
    assert cut(' to=functions.get_weather<|channel|>commentary json<|message|>{"ci').endswith('{"ci<|call|>')
    assert cut(f"{analysis}.<|end|><|start|>assistant<|channel|>comm") == f"{analysis}.<|end|>"
    assert cut(f"{analysis}.<|end|>") == f"{analysis}.<|end|>"
    assert cut("<|channel|>anal") is None
    # a generation that did end with its stop token is kept as history_tokens keeps it
    done = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    assert r.cut_history(done) == r.history_tokens(done)
    # a split multi-byte character: kept as sampled (what the KV holds); a full render drops it
    emoji = enc.encode("<|channel|>final<|message|>ok 🎉", allowed_special="all")
    sampled = emoji[:-1]
    assert r.cut_history(sampled) == [*sampled, harmony_tokens().end]
    assert r.render_items(harmony_parse(r, sampled)) != r.generation_prompt() + r.cut_history(sampled)


# -- chat templates ----------------------------------------------------------------------------


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


CT_PRELUDE = Prelude(tools=cts.ALL_TOOLS)
CHATML = re.compile(r"(?:<\|im_start\|>(?:system|user|assistant|tool)\n.*?<\|im_end\|>\n)+", re.DOTALL)


def ct_parse(r, sampled: Sequence[int]) -> list[dict]:
    parser = r.parser(CT_PRELUDE)
    return hs.items_from_events(parser.feed(list(sampled)) + parser.finish())


def ct_region(r, outputs: list[dict], reasoning: bool, sampled: list[int]) -> str:
    """Where a cut landed, read off the parser's items (not off the code under test)."""
    parsed = ct_parse(r, sampled)
    last = parsed[-1] if parsed else None
    if last is not None and last.get("incomplete"):
        if last["type"] == "reasoning":
            return "reasoning"
        if last["type"] in CALL_TYPES:
            return "call"
        if last["type"] == "message" and not reasoning and all(o["type"] == "message" for o in outputs):
            return "text"
    if not reasoning and r.tokenizer.decode(sampled).endswith("</tool_call>"):
        return "after_call"
    return "other"


def ct_completion(r, outputs: list[dict], reasoning: str | None) -> list[int]:
    """The tokens a model samples for ``outputs``, after ``<think>`` reasoning when given."""
    think = r._encode(f"<think>\n{reasoning}\n</think>\n\n") if reasoning is not None else []
    return think + r.render_completion(outputs)


@st.composite
def ct_cases(draw: st.DrawFn) -> tuple[list[dict], str | None, str, list[dict]]:
    """(outputs, reasoning, region to cut in, new items), outputs drawn to have that region."""
    region = draw(st.sampled_from(["reasoning", "call", "text", "after_call", "other"]))
    outputs = draw(cts.model_outputs())
    if region == "text":
        outputs = [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": draw(cts.OUT_TEXT)}]}
        ]
    elif region in ("call", "after_call"):
        assume(any(o["type"] in CALL_TYPES for o in outputs))
    reasoning = (
        draw(cts.OUT_TEXT)
        if region == "reasoning"
        else (None if region in ("text", "after_call") else draw(st.one_of(st.none(), cts.OUT_TEXT)))
    )
    return outputs, reasoning, region, draw(new_items(cts.TEXT))


def representable(r, text: str) -> bool:
    return r.tokenizer.decode(r._encode(text)) == text


@PROPS
@given(case=ct_cases(), data=st.data())
def test_chat_template_cut_history_appends(
    ct, case: tuple[list[dict], str | None, str, list[dict]], data: st.DataObject
) -> None:
    outputs, reasoning, region, new = case
    r = ct
    assume(representable(r, r.render_text(outputs)))
    completion = ct_completion(r, outputs, reasoning)
    # cut anywhere before the end-of-turn token (a cut after it is no cut)
    cuts = [
        k for k in range(1, len(completion)) if ct_region(r, outputs, reasoning is not None, completion[:k]) == region
    ]
    assume(cuts)
    k = data.draw(st.sampled_from(cuts))
    sampled = completion[:k]
    p = r.profile
    appended = r.generation_prompt() + r.cut_history(sampled)
    # the parent's tokens verbatim + what the template emits after an assistant message
    assert appended == r.generation_prompt() + sampled + [p.end_token, *p.post_tokens]
    calls = cts.call_index(CONTEXT)
    prompt = r.render_prelude(CT_PRELUDE) + r.render_items(CONTEXT) + appended + r.render_items(new, calls=calls)
    assert CHATML.fullmatch(r.tokenizer.decode(prompt)), "not a well-formed ChatML conversation"
    parsed = ct_parse(r, sampled)
    full = r.render_items(parsed)
    text = r.tokenizer.decode(sampled)
    if region == "text":  # equal exactly when the cut text's tokens are the tokenizer's own
        assert (appended == full) == (r._encode(parsed_text(parsed[-1])) == sampled)
    elif region == "after_call":
        assert (appended == full) == (r._encode(text) == sampled)
    elif region == "call":  # deliberately not: the full render closes and re-serializes the call
        assert appended != full
        assert "</tool_call>" not in text[text.rindex("<tool_call>") :]
    elif region == "reasoning" and not p.reasoning:  # the template drops reasoning; the KV keeps it
        assert appended != full
        assert "<think>" in r.tokenizer.decode(appended) and "<think>" not in r.tokenizer.decode(full)
    if appended == full and r.append_break(CONTEXT + parsed, new) is None:
        assert r.render_items(CONTEXT) + appended + r.render_items(new, calls=calls) == r.render_items(
            CONTEXT + parsed + new
        )


def test_chat_template_cut_examples(ct) -> None:
    """One cut per region, spelled out."""
    r = ct
    close = [r.profile.end_token, *r.profile.post_tokens]
    assert r.tokenizer.decode(close) == "<|im_end|>\n"
    gen = r.generation_prompt()
    text = r._encode("Hello world")
    assert r.cut_history(text) == text + close
    assert gen + r.cut_history(text) == r.render_items(ct_parse(r, text))  # a word boundary: equal
    call = r._encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os')
    assert r.cut_history(call) == call + close
    full = r.tokenizer.decode(r.render_items(ct_parse(r, call)))
    assert '"arguments": "{\\"city\\": \\"Os"' in full  # what a full render would have shown instead
    think = r._encode("<think>\nThe user wants")
    assert r.cut_history(think) == think + close
    assert r.render_items(ct_parse(r, think)) == []  # these templates have no place for reasoning
    stopped = text + [r.stop_token_ids[0]]
    assert r.cut_history(stopped) == r.history_tokens(stopped)


# -- the gateway: rollouts with a 16-token output cap ------------------------------------------

CAP = 16
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

LS = {
    "type": "function",
    "name": "ls",
    "description": "List a folder.",
    "parameters": {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]},
}


def cut_script(view: Any) -> Turn:
    """Every turn runs past the cap, cut in a different place by turn: reasoning, a final answer,
    a tool call's arguments."""
    n = sum(1 for m in view.messages() if m.role == "user")
    long = "word " * 40
    kind = n % 3
    if kind == 0:
        return Turn(reasoning=f"Let me think about turn {n}: {long}", text="done")
    if kind == 1:
        return Turn(text=f"Answer {n}: {long}")
    return Turn(tool_calls=(ToolCall("get_weather", {"city": long}),))


class CappedChatEngine(TokenScriptEngine):
    """A chat-template model that always talks past the cap: turn by turn one of ``completions``
    (long reasoning, a long answer, a call with long arguments), cut at ``max_tokens``."""

    name = "capped-chat-fake"
    finish_reason = "length"

    def completion(self, turn: int, params: SamplingParams) -> list[int]:
        return self.completions[turn % len(self.completions)][: params.max_tokens]


def check_rollout(
    live: Any, renderer: Any, prompts: list[list[int]], closings: list[list[int]], run_turn: Any, turns: int = 7
) -> set[str]:
    """Every continuation appends: O(new input) rendered, no fallback, and the engine's prompt is
    the previous prompt + the sampled tokens + a closing + the new item + the generation prompt.
    Returns the types of the items the cuts landed in."""
    resp = run_turn(None, "Start the task.")
    cut_in = set()
    full_after_first = live.metric("respgate_render_tokens_total", {"mode": "full"})
    prev = prompts[-1]
    for i in range(1, turns):
        appended_before = live.metric("respgate_render_tokens_total", {"mode": "append"})
        said = f"Continue with step {i}."
        resp = run_turn(resp["id"], said)
        assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
        assert resp["usage"]["output_tokens"] == CAP
        assert resp["output"][-1]["status"] == "incomplete"
        cut_in.add(resp["output"][-1]["type"])
        new_ids = renderer.render_items([user(said)])
        # rendered per turn: exactly the new item (O(new input)), never the history
        assert live.metric("respgate_render_tokens_total", {"mode": "append"}) - appended_before == len(new_ids)
        now = prompts[-1]
        assert now[: len(prev)] == prev  # the whole previous prompt, as the engine's KV holds it
        tail = now[len(prev) + CAP :]  # after the sampled tokens
        assert any(tail == c + new_ids + renderer.generation_prompt() for c in closings), tail[:8]
        prev = now
    assert full_render_fallbacks(live) == 0
    assert live.metric("respgate_render_tokens_total", {"mode": "full"}) == full_after_first
    return cut_in


@contextlib.contextmanager
def ws_turns(live: Any, model: str, tools: list[dict]) -> Iterator[Callable[[str | None, str], dict]]:
    """One WebSocket connection; a turn is a ``response.create`` (``store: false``)."""
    with live.openai().responses.connect() as conn:

        def run_turn(prev: str | None, said: str) -> dict:
            kw = {"previous_response_id": prev} if prev else {}
            conn.response.create(model=model, input=said, tools=tools, max_output_tokens=CAP, store=False, **kw)
            while True:
                ev = json.loads(conn.recv_bytes())
                if ev["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    assert ev["type"] == "response.incomplete", ev
                    return ev["response"]

        yield run_turn


@contextlib.contextmanager
def http_turns(live: Any, model: str, tools: list[dict]) -> Iterator[Callable[[str | None, str], dict]]:
    """HTTP creates chained by ``previous_response_id`` (``store`` defaults to true)."""

    def run_turn(prev: str | None, said: str) -> dict:
        kw = {"previous_response_id": prev} if prev else {}
        return create(live, model=model, input=said, tools=tools, max_output_tokens=CAP, **kw)

    yield run_turn


TRANSPORTS = pytest.mark.parametrize("transport", [ws_turns, http_turns], ids=["ws", "http"])


@TRANSPORTS
def test_harmony_rollout_with_a_small_output_cap_appends(make_gateway, transport) -> None:
    engine = SimulatedEngine(script=cut_script, record_prompts=True, cache_block_size=1)
    live = make_gateway(Settings(), engine=engine)
    tok = harmony_tokens()
    with transport(live, MODEL, [WEATHER]) as run_turn:
        cut_in = check_rollout(live, HarmonyRenderer(), engine.stats.prompts, [[tok.end], [tok.call]], run_turn)
    assert cut_in == {"reasoning", "message", "function_call"}
    # the engine served every previous prompt and its sampled tokens from its prefix cache
    prompts = engine.stats.prompts
    assert engine.stats.cached_tokens >= sum(len(p) + CAP - 1 for p in prompts[:-1])


@TRANSPORTS
def test_chat_template_rollout_with_a_small_output_cap_appends(make_gateway, ct, transport) -> None:
    from inference.registry import ModelRegistry, ModelRoute

    long = "I will look it up " * 8
    engine = CappedChatEngine(
        [
            ct._encode(f"<think>\nThe user wants the weather, so {long}\n</think>\n\nOk."),
            ct._encode(f"Let me check. {long}"),
            ct._encode('<tool_call>\n{"name": "ls", "arguments": {"p": "%s"}}\n</tool_call>' % long),
        ]
    )
    registry = ModelRegistry([ModelRoute(name="ct", engine=engine, renderer=ct, max_context=8192)])  # type: ignore[arg-type]
    live = make_gateway(Settings(models=["ct"]), engine=SimulatedEngine(), registry=registry)
    with transport(live, "ct", [WEATHER, LS]) as run_turn:
        cut_in = check_rollout(
            live, ct, engine.stats.prompts, [[ct.profile.end_token, *ct.profile.post_tokens]], run_turn
        )
    assert cut_in == {"reasoning", "message", "function_call"}


def test_a_cut_inside_the_first_header_leaves_no_trace(make_gateway) -> None:
    """A header longer than the cap (a long tool name): nothing was said, the output is empty, and
    the history ends before the generation prompt; the next turn appends to that."""
    name = "look_up_the_current_weather_conditions_for_a_city_by_its_name_x"
    tool = dict(WEATHER, name=name)
    script = lambda view: Turn(tool_calls=(ToolCall(name, {"city": "Oslo"}),))  # noqa: E731
    engine = SimulatedEngine(script=script, record_prompts=True)
    live = make_gateway(Settings(), engine=engine)
    r = HarmonyRenderer()
    first = create(live, input="weather?", tools=[tool], max_output_tokens=CAP)
    assert first["status"] == "incomplete" and first["output"] == []
    nxt = create(live, input="and now?", tools=[tool], max_output_tokens=CAP, previous_response_id=first["id"])
    assert nxt["status"] == "incomplete"
    p1, p2 = engine.stats.prompts
    gen = r.generation_prompt()
    assert p2 == p1[: len(p1) - len(gen)] + r.render_items([user("and now?")]) + gen
    assert full_render_fallbacks(live) == 0
