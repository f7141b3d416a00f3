"""HarmonyStreamParser: item events from sampled tokens, in any chunking."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.harmony import HarmonyParseError, HarmonyRenderer, render_completion
from inference.parse import ItemDelta, ItemEnd, ItemStart
from inference.renderer import Prelude

from .harmony_support import ALL_TOOLS, feed_all, items_from_events, model_outputs

PRELUDE = Prelude(tools=ALL_TOOLS)


def sample(enc, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outputs=model_outputs(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_round_trip_in_any_chunking(renderer: HarmonyRenderer, outputs: list[dict], sizes: list[int]) -> None:
    """Canonical tokens of output items, fed in arbitrary chunks, parse back to the same items."""
    tokens = render_completion(renderer.item_messages(outputs))
    events = feed_all(renderer.parser(PRELUDE), tokens, sizes)
    assert items_from_events(events) == outputs
    for ev in events:  # text is only emitted once decodable
        assert not (isinstance(ev, ItemDelta) and ("\ufffd" in ev.text or ev.text == ""))


def test_multibyte_characters_split_across_tokens(renderer: HarmonyRenderer, enc) -> None:
    text = "héllo 世界 🎉🎉 ok"
    tokens = sample(enc, f"<|channel|>final<|message|>{text}<|return|>")
    # some token of the emoji is not decodable on its own: the parser must wait for the rest
    assert any("\ufffd" in enc.decode([t]) for t in tokens)
    events = feed_all(renderer.parser(PRELUDE), tokens)
    deltas = [e.text for e in events if isinstance(e, ItemDelta)]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_event_sequence_for_reasoning_then_call(renderer: HarmonyRenderer, enc) -> None:
    tokens = sample(
        enc,
        "<|channel|>analysis<|message|>Need weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Oslo"}<|call|>',
    )
    parser = renderer.parser(PRELUDE)
    events = parser.feed(tokens) + parser.finish()
    assert events == [
        ItemStart("reasoning", phase="analysis"),
        ItemDelta("Need weather."),
        ItemEnd(),
        ItemStart("function_call", name="get_weather", namespace=None, phase="commentary"),
        ItemDelta('{"city":"Oslo"}'),
        ItemEnd(),
    ]
    # every token of the analysis message, header and terminator included
    assert parser.reasoning_tokens == len(sample(enc, "<|channel|>analysis<|message|>Need weather.<|end|>"))


def test_namespace_and_custom_tools(renderer: HarmonyRenderer, enc) -> None:
    cases = {
        "commentary to=mcp_fs.read_file <|constrain|>json": ItemStart(
            "function_call", "read_file", "mcp_fs", "commentary"
        ),
        "commentary to=mcp_fs.write_raw": ItemStart("custom_tool_call", "write_raw", "mcp_fs", "commentary"),
        "commentary to=functions.apply_patch": ItemStart("custom_tool_call", "apply_patch", None, "commentary"),
        "commentary to=other.thing": ItemStart("function_call", "thing", "other", "commentary"),
        "commentary to=python": ItemStart("function_call", "python", None, "commentary"),
    }
    for header, start in cases.items():
        parser = renderer.parser(PRELUDE)
        events = parser.feed(sample(enc, f"<|channel|>{header}<|message|>x<|call|>"))
        assert events[0] == start, header


def test_custom_tool_unknown_without_prelude(renderer: HarmonyRenderer, enc) -> None:
    """Which tools are freeform comes from the prelude the generation ran under."""
    events = renderer.parser(Prelude()).feed(
        sample(enc, "<|channel|>commentary to=functions.apply_patch<|message|>x<|call|>")
    )
    assert events[0].kind == "function_call"


def test_recipient_in_role_header(renderer: HarmonyRenderer, enc) -> None:
    """A non-canonical but valid form gpt-oss samples: the recipient before the channel."""
    tokens = sample(enc, " to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>")
    events = feed_all(renderer.parser(PRELUDE), tokens)
    assert events[0] == ItemStart("function_call", name="get_weather", namespace=None, phase="commentary")


def test_commentary_without_recipient_is_a_message(renderer: HarmonyRenderer, enc) -> None:
    tokens = sample(
        enc,
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done<|return|>",  # noqa: E501 (a token string as the model writes it)
    )
    parser = renderer.parser(PRELUDE)
    events = feed_all(parser, tokens, [3])
    assert [e for e in events if isinstance(e, ItemStart)] == [
        ItemStart("message", phase="commentary"),
        ItemStart("message", phase="final"),
    ]
    assert parser.reasoning_tokens == 0


def test_finish_closes_a_cut_off_item(renderer: HarmonyRenderer, enc) -> None:
    parser = renderer.parser(PRELUDE)
    events = parser.feed(sample(enc, "<|channel|>final<|message|>Hello wor"))
    assert events[0] == ItemStart("message", phase="final")
    assert parser.finish() == [ItemEnd(complete=False)]
    assert parser.finish() == []


def test_finish_inside_a_header_emits_nothing(renderer: HarmonyRenderer, enc) -> None:
    parser = renderer.parser(PRELUDE)
    assert parser.feed(sample(enc, "<|channel|>fin")) == []
    assert parser.finish() == []


def test_deltas_are_coalesced_per_feed(renderer: HarmonyRenderer, enc) -> None:
    tokens = sample(enc, "<|channel|>final<|message|>one two three four<|return|>")
    events = renderer.parser(PRELUDE).feed(tokens)
    assert events == [ItemStart("message", phase="final"), ItemDelta("one two three four"), ItemEnd()]


def test_malformed_output_raises(renderer: HarmonyRenderer, enc) -> None:
    parser = renderer.parser(PRELUDE)
    with pytest.raises(HarmonyParseError):
        parser.feed(sample(enc, "<|channel|>final<|message|>a<|end|><|channel|>final"))


def test_special_token_lookalike_text(renderer: HarmonyRenderer, enc) -> None:
    """Text spelling ``<|end|>`` is ordinary tokens and does not end the message."""
    outputs = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a<|end|>b"}]}]
    tokens = render_completion(renderer.item_messages(outputs))
    assert items_from_events(feed_all(renderer.parser(PRELUDE), tokens)) == outputs


def test_long_answer_token_by_token(renderer: HarmonyRenderer, enc) -> None:
    """A long answer fed one token at a time yields one delta per token, in order."""
    text = "word " * 2000
    tokens = sample(enc, f"<|channel|>final<|message|>{text}<|return|>")
    parser = renderer.parser(PRELUDE)
    out = []
    for t in tokens:
        out += parser.feed([t])
    deltas = [e.text for e in out if isinstance(e, ItemDelta)]
    assert "".join(deltas) == text and len(deltas) == len(tokens) - 4
