"""The harmony parser's fast path reads exactly what harmony's own parser reads.

Reference: ``HarmonyStreamParser(fast=False)``, harmony's ``StreamableParser`` from the first token.
Every generated stream — canonical outputs, the header shapes a real model may sample, special
tokens and broken UTF-8 inside content, garbage after a terminator, random token soup — must give
the same events, the same reasoning token count and the same error, in any chunking; and the fast
path must actually be the one reading canonical output.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.harmony import HarmonyParseError, HarmonyRenderer, HarmonyStreamParser, render_completion
from inference.harmony_core import ToolCatalog, harmony_encoding
from inference.renderer import Prelude

from .harmony_support import ALL_TOOLS, model_outputs

PRELUDE = Prelude(tools=ALL_TOOLS)
CATALOG = ToolCatalog(ALL_TOOLS)
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HEADERS = [
    "<|channel|>analysis",
    "<|channel|>final",
    "<|channel|>commentary",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json",
    "<|channel|>commentary to=functions.get_weather<|constrain|>json",
    " to=functions.get_weather<|channel|>commentary json",
    " to=functions.apply_patch<|channel|>commentary",
    "<|channel|>commentary to=mcp_fs.read_file <|constrain|>json",
    "<|channel|>final to=assistant",
    "<|channel|>commentary to=functions.get_weather json",
    " to=functions.get_weather<|channel|>commentary <|constrain|>json",
    " to=functions.get_weather<|channel|>commentary<|constrain|>json",
    "<|channel|>commentary json",
    "<|channel|>analysis to=functions.ping",
    "<|channel|>commentary to=functions.get_weather  <|constrain|>json",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json ",
    # shapes the fast path leaves to harmony
    "",
    "<|channel|> final",
    "<|channel|>final extra words",
    "junk<|channel|>final",
    "<|channel|>commentary<|constrain|>json",
    "<|channel|>commentary to=functions.x code",
    "<|channel|>reflection",
    " to=a<|channel|>commentary to=b",
    "<|channel|>final<|start|>",
]
ROLES = ["assistant", "assistant", "assistant", "user", "tool", "assistant to=functions.ping"]
TERMINATORS = ["<|end|>", "<|return|>", "<|call|>"]
CONTENT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "héllo 世界 🎉",
            '{"city":"Oslo"}',
            "a<|start|>b",
            "x<|channel|>y",
            "<|constrain|>",
            " ",
            "\n\n",
            "<|endoftext|>",
            "tail<|message|>",
            "",
        ]
    ),
)


@st.composite
def harmony_texts(draw: Any) -> str:
    """Harmony-ish completion text (after the ``<|start|>assistant`` generation prompt)."""
    out = []
    for i in range(draw(st.integers(1, 4))):
        if i:
            out.append(draw(st.sampled_from(["<|start|>", "<|start|>", "", "junk", "<|end|>"])))
            out.append(draw(st.sampled_from(ROLES)))
        out.append(draw(st.sampled_from(HEADERS)))
        out.append(draw(st.sampled_from(["<|message|>", "<|message|>", ""])))
        out.append(draw(CONTENT))
        out.append(draw(st.sampled_from(TERMINATORS + [""])))
    return "".join(out)


def run(tokens: list[int], sizes: list[int], fast: bool) -> tuple[list, int, str | None, bool]:
    parser = HarmonyStreamParser(CATALOG, fast=fast)
    events: list = []
    error = None
    i = k = 0
    try:
        while i < len(tokens):
            n = sizes[k % len(sizes)]
            events += parser.feed(tokens[i : i + n])
            i, k = i + n, k + 1
        events += parser.finish()
    except HarmonyParseError:
        error = "HarmonyParseError"
    return events, parser.reasoning_tokens, error, parser.handed_over


def same_as_harmony(tokens: list[int], sizes: list[int]) -> bool:
    """Asserts equality with the reference; returns whether the fast path read it all."""
    fast_events, fast_reasoning, fast_error, handed_over = run(tokens, sizes, fast=True)
    ref_events, ref_reasoning, ref_error, _ = run(tokens, sizes, fast=False)
    assert fast_error == ref_error
    assert fast_events == ref_events
    assert fast_reasoning == ref_reasoning
    return not handed_over


CHUNKS = st.lists(st.integers(1, 7), min_size=1, max_size=4)


@SETTINGS
@given(outputs=model_outputs(), sizes=CHUNKS)
def test_canonical_outputs_are_read_by_the_fast_path(
    renderer: HarmonyRenderer, outputs: list[dict], sizes: list[int]
) -> None:
    tokens = render_completion(renderer.item_messages(outputs))
    read_fast = same_as_harmony(tokens, sizes)
    text = harmony_encoding().decode_utf8(tokens)
    unusual = any(
        s in text.split("<|message|>", 1)[-1]
        for s in ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|endoftext|>")
    )
    if not unusual:  # special tokens inside content are harmony's to read
        assert read_fast, text[:300]


@SETTINGS
@given(text=harmony_texts(), sizes=CHUNKS)
def test_any_header_shape_content_and_garbage(text: str, sizes: list[int]) -> None:
    same_as_harmony(harmony_encoding().encode(text, allowed_special="all"), sizes)


# token soup: ordinary tokens, byte fragments that are not UTF-8 alone, specials, out-of-vocabulary ids
SOUP = st.lists(
    st.one_of(
        st.integers(0, 2000),
        st.integers(199990, 200020),
        st.integers(201080, 201100),
        st.sampled_from([200005, 200008, 200007, 200006, 173781, 35644, 12606, 17196]),
    ),
    max_size=40,
)


@SETTINGS
@given(
    prefix=st.sampled_from(["", "<|channel|>final<|message|>", "<|channel|>analysis<|message|>x"]),
    soup=SOUP,
    sizes=CHUNKS,
)
def test_token_soup(prefix: str, soup: list[int], sizes: list[int]) -> None:
    same_as_harmony(harmony_encoding().encode(prefix, allowed_special="all") + soup, sizes)


def test_a_typical_turn_never_touches_harmonys_parser(renderer: HarmonyRenderer) -> None:
    outputs = [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Check the weather."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
    ]
    tokens = render_completion(renderer.item_messages(outputs))
    assert same_as_harmony(tokens, [1])
    parser = renderer.parser(PRELUDE)
    parser.feed(tokens)
    assert not parser.handed_over


def test_model_header_variants_stay_fast() -> None:
    """Shapes a real gpt-oss samples (recipient in the role header, ``json`` without constrain)."""
    enc = harmony_encoding()
    text = (
        "<|channel|>analysis<|message|>Need weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>'
    )
    assert same_as_harmony(enc.encode(text, allowed_special="all"), [1])


def test_unusual_header_is_handed_over_and_still_parsed() -> None:
    enc = harmony_encoding()
    tokens = enc.encode("<|channel|>final extra words<|message|>x<|return|>", allowed_special="all")
    assert not same_as_harmony(tokens, [2])


def test_one_token_deltas_read_known_texts_from_the_memo_and_split_characters_whole(monkeypatch) -> None:
    """A one-token delta of an ordinary token whose text was decoded before is a memo lookup; a
    character split across tokens (emoji, CJK) is still emitted whole, once, as harmony does."""
    enc = harmony_encoding()
    header = enc.encode("<|channel|>final<|message|>", allowed_special="all")
    content = enc.encode("héllo 世界 🎉👩‍👩‍👧 done", allowed_special="all")
    end = enc.encode("<|return|>", allowed_special="all")
    assert same_as_harmony(header + content + end, [1])  # fills the memo for the whole tokens
    from inference import harmony_parse

    vocab = harmony_parse.vocab_bytes()
    parser = HarmonyStreamParser(CATALOG)
    events = parser.feed(header)
    calls: list[int] = []
    original = vocab.token_bytes
    monkeypatch.setattr(vocab, "token_bytes", lambda t: calls.append(t) or original(t))
    events += [ev for tok in content + end for ev in parser.feed([tok])] + parser.finish()
    assert "".join(e.text for e in events if hasattr(e, "text")) == "héllo 世界 🎉👩‍👩‍👧 done"
    split = [t for t in content if t not in vocab.texts]
    assert split, "the text has tokens that are not whole UTF-8 on their own"
    assert sorted(set(calls)) == sorted(set(split))  # only those were decoded again


def test_headers_read_once_are_remembered_within_a_bound(monkeypatch) -> None:
    """A header the fast path read is a lookup the next time (same events as harmony's parser);
    the memo stops growing at its bound and headers past it are still read."""
    from inference import harmony_parse

    monkeypatch.setattr(harmony_parse, "_HEADERS", {})
    monkeypatch.setattr(harmony_parse, "_MAX_HEADERS", 3)
    enc = harmony_encoding()
    for name in ["a", "b", "c", "d", "e", "a", "e"]:
        text = f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{{}}<|call|>"
        assert same_as_harmony(enc.encode(text, allowed_special="all"), [1, 3])
    assert len(harmony_parse._HEADERS) == 3
