"""The fast message path (harmony skeleton + tiktoken text tokens) equals harmony's ``enc.render``.

Every test compares against ``enc.render(message)`` of the very message the renderer built, for
arbitrary text (any unicode incl. lone surrogates, special-token spellings, whitespace and digit
runs, ``\\r\\n``, emoji) in every message kind the renderer produces. Some tests also check the fast
path *was* taken (``fast_renders``), so a silent fallback to harmony cannot pass for a fast path.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from openai_harmony import Author, Message, Role, SystemContent, TextContent

from inference import harmony_content, text_runs
from inference.harmony import HarmonyRenderer
from inference.harmony_content import MessageTokenizer

ROOT = Path(__file__).resolve().parents[2]
PROPS = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

SPECIALS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|endoftext|>",
    "<|endofprompt|>",
    "<|reserved_200013|>",
    "<|",
    "|>",
    " to=functions.f",
    "<|start|>assistant<|channel|>final<|message|>",
    "<|constrain|>json",
]
SURROGATES = ["\ud800", "\udfff", "\ud83d", "a\udc00b"]  # lone: harmony raises, tiktoken would not
RUN_CHARS = [" ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "0", "7", "a", "é", "😀", "👩‍👩‍👧", "\x00", "-", "#"]
PIECE = st.one_of(
    st.text(max_size=30),  # every category, lone surrogates (Cs) included
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.sampled_from(SPECIALS + SURROGATES),
    st.builds(lambda c, n: c * n, st.sampled_from(RUN_CHARS), st.integers(1, 2500)),
)
#: pieces joined; a text with a run of one character class longer than ``text_runs.MAX_RUN`` is
#: left out: the renderer cuts such a run on purpose, so its tokens differ from one whole-text
#: encode around the cut (``inference/text_runs.py``; ``tests/inference/test_text_runs.py``).
#: Two same-class runs side by side (e.g. 2,048 "😀" then 2,048 NULs, both symbols) make one.
TEXT = st.lists(PIECE, max_size=6).map("".join).filter(lambda s: text_runs.segments(s) == [s])
NAME = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True),
    st.text(min_size=1, max_size=12),
    st.sampled_from(SPECIALS),
)


@pytest.fixture(scope="module")
def fast() -> HarmonyRenderer:
    """A renderer whose every plain-text message takes the fast path."""
    r = HarmonyRenderer()
    r._messages.min_chars = 0
    return r


def _outcome(fn):
    try:
        return fn()
    except ValueError as exc:  # harmony's answer to lone surrogates
        return ("ValueError", str(exc).split(":")[0])


def assert_matches_harmony(renderer: HarmonyRenderer, enc, items: list[dict], calls=None) -> None:
    """render_items equals enc.render of each message (or both raise ValueError)."""
    messages = renderer.item_messages(items, calls)
    expected = _outcome(lambda: [t for m in messages for t in enc.render(m)])
    assert _outcome(lambda: renderer.render_items(items, calls)) == expected


def _texts_ok(*texts: str) -> bool:
    return all(harmony_content._utf8_ok(t) for t in texts)


# -- property tests, one per message kind --------------------------------------------------------


@PROPS
@given(
    role=st.sampled_from(["user", "developer", "system", "assistant"]),
    phase=st.sampled_from([None, "commentary", "final_answer"]),
    texts=st.lists(TEXT, min_size=0, max_size=4),
)
def test_messages(fast: HarmonyRenderer, enc, role: str, phase, texts: list[str]) -> None:
    kind = "output_text" if role == "assistant" else "input_text"
    item = {"type": "message", "role": role, "content": [{"type": kind, "text": t} for t in texts]}
    if phase:
        item["phase"] = phase
    before = fast._messages.fast_renders
    assert_matches_harmony(fast, enc, [item])
    assert fast._messages.fast_renders == before + _texts_ok(*texts)


@PROPS
@given(texts=st.lists(TEXT, min_size=1, max_size=3), summary=st.booleans())
def test_reasoning(fast: HarmonyRenderer, enc, texts: list[str], summary: bool) -> None:
    if summary:
        item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": t} for t in texts]}
    else:
        item = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": t} for t in texts]}
    assert_matches_harmony(fast, enc, [item])


@PROPS
@given(name=NAME, namespace=st.one_of(st.none(), NAME), body=TEXT, custom=st.booleans())
def test_tool_calls(fast: HarmonyRenderer, enc, name: str, namespace, body: str, custom: bool) -> None:
    if custom:
        item = {"type": "custom_tool_call", "call_id": "c", "name": name, "input": body}
    else:
        item = {"type": "function_call", "call_id": "c", "name": name, "arguments": body}
    if namespace is not None:
        item["namespace"] = namespace
    assert_matches_harmony(fast, enc, [item])


@PROPS
@given(name=NAME, output=st.one_of(TEXT, st.lists(TEXT, max_size=3)), custom=st.booleans())
def test_tool_outputs(fast: HarmonyRenderer, enc, name: str, output, custom: bool) -> None:
    call = {"type": "custom_tool_call" if custom else "function_call", "call_id": "c", "name": name}
    if isinstance(output, list):
        assume(text_runs.segments("".join(output)) == ["".join(output)])  # parts side by side: one run
        output = [{"type": "input_text", "text": t} for t in output]
    item = {"type": "custom_tool_call_output" if custom else "function_call_output", "call_id": "c", "output": output}
    assert_matches_harmony(fast, enc, [item], calls={"c": call})


@PROPS
@given(text=TEXT)
def test_text_tokens_are_tiktoken_encode_ordinary(fast: HarmonyRenderer, enc, text: str) -> None:
    """The premise, stated directly: between ``<|message|>`` and the terminator harmony puts
    exactly o200k_base's ``encode_ordinary`` of the text (for valid UTF-8)."""
    from inference.harmony_core import content_encoding

    msg = Message.from_role_and_content(Role.USER, text)
    if not _texts_ok(text):
        with pytest.raises(ValueError):
            enc.render(msg)
        return
    skeleton = enc.render(Message.from_role_and_content(Role.USER, ""))
    assert enc.render(msg) == skeleton[:-1] + content_encoding().encode_ordinary(text) + skeleton[-1:]


# -- explicit cases ------------------------------------------------------------------------------


SOURCES = sorted([*ROOT.glob("inference/*.py"), *ROOT.glob("gateway/**/*.py"), ROOT / "pyproject.toml"])


@pytest.mark.parametrize("path", SOURCES[:40], ids=lambda p: p.name)
def test_real_source_files(renderer: HarmonyRenderer, enc, path: Path) -> None:
    """A file read as a tool output (the benchmark's shape), as user text and as call arguments."""
    text = path.read_text()
    call = {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path": "x"}'}
    before = renderer._messages.fast_renders
    assert_matches_harmony(
        renderer,
        enc,
        [
            call,
            {"type": "function_call_output", "call_id": "c1", "output": text},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            {"type": "function_call", "call_id": "c2", "name": "write", "arguments": text},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]},
        ],
    )
    sizes = [len(call["arguments"])] + [len(text)] * 4
    assert renderer._messages.fast_renders == before + sum(n >= harmony_content.FAST_MIN_CHARS for n in sizes)


def test_large_tool_output_takes_the_fast_path(renderer: HarmonyRenderer, enc) -> None:
    """Fails if the renderer stops using the fast path for the gateway's costliest message."""
    text = (ROOT / "inference" / "harmony_render.py").read_text() * 3
    assert len(text) > harmony_content.FAST_MIN_CHARS
    call = {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"}
    item = {"type": "function_call_output", "call_id": "c1", "output": text}
    before = renderer._messages.fast_renders
    ids = renderer.render_items([item], calls={"c1": call})
    assert renderer._messages.fast_renders == before + 1
    assert ids == enc.render(renderer.item_messages([item], {"c1": call})[0])


def test_multi_part_text_is_tokenized_part_by_part(renderer: HarmonyRenderer, enc) -> None:
    """Harmony tokenizes each part on its own: splitting a word across parts changes the tokens,
    and the fast path reproduces that (not the tokens of the joined text)."""
    parts = ["def render_items(self, ite", "ms):\n    return []\r\n", "", "  ", "<|end|>", "😀" * 3]
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t} for t in parts]}
    joined = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "".join(parts)}]}
    assert renderer.render_items([item]) != renderer.render_items([joined])
    assert_matches_harmony(renderer, enc, [item])
    assert_matches_harmony(renderer, enc, [joined])


def test_threshold_boundary(enc) -> None:
    tokenizer = MessageTokenizer(min_chars=100)
    for n, taken in ((0, 0), (99, 0), (100, 1), (101, 1)):
        msg = Message.from_role_and_content(Role.USER, "x " * (n // 2) + "y" * (n % 2))
        before = tokenizer.fast_renders
        assert tokenizer.render(msg) == enc.render(msg)
        assert tokenizer.fast_renders - before == taken, n
    # the total over all parts counts, not each part
    msg = Message.from_role_and_contents(Role.USER, [TextContent(text="a" * 50), TextContent(text="b" * 50)])
    before = tokenizer.fast_renders
    assert tokenizer.render(msg) == enc.render(msg)
    assert tokenizer.fast_renders == before + 1


def test_lone_surrogates_are_left_to_harmony(renderer: HarmonyRenderer, enc) -> None:
    """tiktoken would replace a lone surrogate with U+FFFD; harmony rejects it. We keep harmony's
    behaviour (ValueError) by not taking the fast path."""
    msg = Message.from_role_and_content(Role.USER, "big file " * 1000 + "\ud800")
    before = renderer._messages.fast_renders
    with pytest.raises(ValueError):
        enc.render(msg)
    with pytest.raises(ValueError):
        renderer._messages.render(msg)
    assert renderer._messages.fast_renders == before


def test_non_text_content_uses_harmony(enc) -> None:
    tokenizer = MessageTokenizer(min_chars=0)
    msg = Message.from_role_and_content(Role.SYSTEM, SystemContent.new())
    assert tokenizer.render(msg) == enc.render(msg)
    assert tokenizer.fast_renders == 0


def test_skeleton_cache_is_bounded_and_stays_correct(enc, monkeypatch) -> None:
    monkeypatch.setattr(harmony_content, "_MAX_SKELETONS", 8)
    tokenizer = MessageTokenizer(min_chars=0)
    for i in range(30):
        author = Author.new(Role.TOOL, f"functions.tool_{i % 11}")
        msg = Message.from_author_and_content(author, f"output {i}\n" * i).with_channel("commentary")
        assert tokenizer.render(msg.with_recipient("assistant")) == enc.render(msg)
        assert len(tokenizer._skeletons) <= 8
    assert tokenizer.fast_renders == 30


def test_concurrent_renders_agree(enc) -> None:
    tokenizer = MessageTokenizer(min_chars=0)
    text = (ROOT / "inference" / "harmony_content.py").read_text()
    messages = [
        Message.from_author_and_content(Author.new(Role.TOOL, f"functions.t{i % 5}"), text[: 200 * i])
        .with_channel("commentary")
        .with_recipient("assistant")
        for i in range(40)
    ]
    expected = [enc.render(m) for m in messages]
    failures: list[int] = []

    def work(offset: int) -> None:
        for i in range(len(messages)):
            j = (i + offset) % len(messages)
            if tokenizer.render(messages[j]) != expected[j]:
                failures.append(j)

    threads = [threading.Thread(target=work, args=(k * 7,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_start_up_check_turns_the_fast_path_off_when_tokenizers_disagree(monkeypatch) -> None:
    """An installation whose tiktoken splits text unlike harmony renders with harmony only."""
    from inference import harmony_content

    class Drifted:
        def __init__(self, real):
            self._real = real

        def encode_ordinary(self, text):
            return list(reversed(self._real.encode_ordinary(text)))

    real = harmony_content.content_encoding()
    monkeypatch.setattr(harmony_content, "content_encoding", lambda: Drifted(real))
    tok = harmony_content.MessageTokenizer()
    assert tok.min_chars > 10**12
    monkeypatch.undo()
    assert harmony_content.MessageTokenizer().min_chars == harmony_content.FAST_MIN_CHARS
