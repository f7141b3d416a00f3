"""HermesStreamParser: item events from sampled tokens, in any chunking, never crashing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from inference.chat_template_render import ChatTemplateRenderer
from inference.parse import ItemDelta, ItemEnd, ItemStart
from inference.renderer import Prelude

from .chat_template_support import ALL_TOOLS, model_outputs
from .harmony_support import feed_all, items_from_events

PRELUDE = Prelude(tools=ALL_TOOLS)
PROPS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def sample(r: ChatTemplateRenderer, text: str, stop: bool = True) -> list[int]:
    return r._encode(text) + ([r.stop_token_ids[0]] if stop else [])


def parse(r: ChatTemplateRenderer, text: str, *, stop: bool = True, prelude: Prelude = PRELUDE, sizes=None) -> list:
    return feed_all(r.parser(prelude), sample(r, text, stop), sizes)


@PROPS
@given(outputs=model_outputs(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_round_trip_in_any_chunking(ct_renderer: ChatTemplateRenderer, outputs: list[dict], sizes: list[int]) -> None:
    text = ct_renderer.render_text(outputs)
    assume(ct_renderer.tokenizer.decode(ct_renderer._encode(text)) == text)
    events = feed_all(ct_renderer.parser(PRELUDE), ct_renderer.render_completion(outputs), sizes)
    assert items_from_events(events) == outputs
    for ev in events:  # text is only emitted once decodable, never empty
        assert not (isinstance(ev, ItemDelta) and ("\ufffd" in ev.text or ev.text == ""))


@PROPS
@given(text=st.text(max_size=80), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4), stop=st.booleans())
def test_never_crashes_and_events_are_well_formed(
    smollm2_renderer: ChatTemplateRenderer, text: str, sizes: list[int], stop: bool
) -> None:
    """Arbitrary text, with tag fragments mixed in, always folds into well-formed items."""
    frags = [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        '{"name": "get_weather", "arguments": {',
        '{"name": "apply_patch", "arguments": {"input": "x"}}',
        "\n",
    ]
    mixed = "".join(frags[ord(c) % len(frags)] if ord(c) % 3 == 0 else c for c in text)
    items_from_events(parse(smollm2_renderer, mixed, stop=stop, sizes=sizes))  # asserts the event grammar


def test_multibyte_characters_split_across_tokens(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    text = "héllo 世界 🎉🎉 ok"
    tokens = sample(r, text)
    assert any("\ufffd" in r.tokenizer.decode([t]) for t in tokens)
    events = feed_all(r.parser(PRELUDE), tokens)
    deltas = [e.text for e in events if isinstance(e, ItemDelta)]
    assert "".join(deltas) == text and all("\ufffd" not in d for d in deltas)


def test_text_then_streamed_call_then_custom_call(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mcp_fs__write_raw", "arguments": {"input": "a\\nb"}}\n</tool_call>'
    )
    parser = r.parser(PRELUDE)
    tokens = sample(r, text)
    events = []
    for t in tokens:
        events += parser.feed([t])
    events += parser.finish()
    starts = [e for e in events if isinstance(e, ItemStart)]
    assert starts == [
        ItemStart("message"),
        ItemStart("function_call", name="get_weather", namespace=None),
        ItemStart("custom_tool_call", name="write_raw", namespace="mcp_fs"),
    ]
    args = [e.text for e in events[events.index(starts[1]) + 1 :] if isinstance(e, ItemDelta)]
    assert len(args) > 3  # streamed, not emitted at the end
    assert items_from_events(events) == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "custom_tool_call", "call_id": "c", "name": "write_raw", "namespace": "mcp_fs", "input": "a\nb"},
    ]
    assert parser.reasoning_tokens == 0


def test_reasoning_then_answer(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    parser = r.parser(PRELUDE)
    think = "<think>\nNeed weather.\n\nReally.\n</think>"
    events = feed_all(parser, sample(r, think + "\n\nSunny."), [2])
    assert items_from_events(events) == [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Need weather.\n\nReally."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ]
    assert len(r._encode(think)) - 2 <= parser.reasoning_tokens <= len(r._encode(think)) + 1


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "get_weather", "arguments" {"city": 1}}',  # broken header
        "not json at all",
        '{"arguments": {}}',  # no name
        '["get_weather"]',
    ],
)
def test_malformed_call_is_text(smollm2_renderer: ChatTemplateRenderer, body: str) -> None:
    text = f"Hi\n<tool_call>{body}</tool_call> bye"
    items = items_from_events(parse(smollm2_renderer, text, sizes=[3]))
    assert items == [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def test_bad_arguments_after_a_good_header_stay_a_call(smollm2_renderer: ChatTemplateRenderer) -> None:
    """The documented exception: the call was already streamed when its arguments went wrong."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    items = items_from_events(parse(smollm2_renderer, text))
    assert items == [{"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": '{"city": '}]


def test_call_with_other_key_order_and_unknown_names(smollm2_renderer: ChatTemplateRenderer) -> None:
    text = (
        '<tool_call>{"arguments": {"a": 1}, "name": "get_weather"}</tool_call>'
        '<tool_call>{"name": "other__thing", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": "print(1)"}</tool_call>'
    )
    items = items_from_events(parse(smollm2_renderer, text))
    assert [(i["name"], i.get("namespace"), i["arguments"]) for i in items] == [
        ("get_weather", None, '{"a": 1}'),
        ("thing", "other", "{}"),
        ("python", None, '"print(1)"'),
    ]


def test_custom_tool_unknown_without_prelude(smollm2_renderer: ChatTemplateRenderer) -> None:
    """Which tools are freeform comes from the prelude the generation ran under."""
    text = '<tool_call>{"name": "apply_patch", "arguments": {"input": "x"}}</tool_call>'
    items = items_from_events(parse(smollm2_renderer, text, prelude=Prelude()))
    assert items == [{"type": "function_call", "call_id": "c", "name": "apply_patch", "arguments": '{"input": "x"}'}]


def test_cut_off_inside_a_call(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    parser = r.parser(PRELUDE)
    events = parser.feed(sample(r, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', stop=False))
    assert events[0] == ItemStart("function_call", name="get_weather", namespace=None)
    tail = parser.finish()
    assert tail[-1] == ItemEnd(complete=False) and parser.finish() == []
    text = "".join(e.text for e in events + tail if isinstance(e, ItemDelta))
    assert text == '{"city": "Os'


def test_cut_off_message_and_before_a_header(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    items = items_from_events(parse(r, "Hello wor", stop=False))
    assert items == [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello wor"}],
            "incomplete": True,
        }
    ]
    items = items_from_events(parse(r, '<tool_call>\n{"na', stop=False))
    assert items[0]["content"][0]["text"] == '<tool_call>\n{"na' and items[0]["incomplete"]


def test_empty_answer_and_tokens_after_stop(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    parser = r.parser(PRELUDE)
    events = parser.feed([r.stop_token_ids[0]] + r._encode("ignored")) + parser.finish()
    assert events == [ItemStart("message"), ItemEnd()]


def test_whitespace_between_and_after_calls_is_format(smollm2_renderer: ChatTemplateRenderer) -> None:
    text = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>\n\n<tool_call>{"name": "ping", "arguments": {}}</tool_call>\n'  # noqa: E501 (a token string as the model writes it)
    items = items_from_events(parse(smollm2_renderer, text))
    assert [i["type"] for i in items] == ["function_call", "function_call"]
    items = items_from_events(parse(smollm2_renderer, text + "\nDone."))
    assert items[-1]["content"][0]["text"] == "Done."


def test_deltas_are_coalesced_per_feed(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    events = r.parser(PRELUDE).feed(sample(r, "one two three four"))
    assert events == [ItemStart("message"), ItemDelta("one two three four"), ItemEnd()]


def test_long_answer_token_by_token(smollm2_renderer: ChatTemplateRenderer) -> None:
    """A long answer fed one token at a time: every delta in order, nothing held for long."""
    r = smollm2_renderer
    text = "word " * 2000
    tokens = sample(r, text)
    parser = r.parser(PRELUDE)
    out = []
    for t in tokens:
        out += parser.feed([t])
    assert "".join(e.text for e in out if isinstance(e, ItemDelta)) == text
