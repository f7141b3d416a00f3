"""The prelude's developer message with long client text (inference/harmony_prelude.py).

Property: the probe-and-splice rendering equals harmony's own ``enc.render`` of the same developer
message, for instructions and tools whose strings (descriptions, property names, enum values,
``required`` entries) hold long lines and long runs of line breaks of any characters — up to
:data:`inference.text_runs.MAX_RUN` characters per run, where harmony's slow tokenizer is still
affordable as the oracle. Beyond that, the bound: a megabyte of any run in any field renders
(harmony itself panics or takes minutes) and decodes back to the client's text.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import RenderOptions

from inference import harmony_prelude
from inference.harmony_core import ToolCatalog, content_encoding
from inference.harmony_render import HarmonyRenderer
from inference.renderer import Prelude
from inference.text_runs import MAX_RUN

PROPS = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CHARS = [
    " ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "a",
    "Z",
    "é",
    "e\u0301",
    "中",
    "😀",
    '"',
    "\\",
    "//",
    "*/",
    "`",
    "{",
    "}",
    "<|end|>",
    "0",
    "9",
    "_",
    "-",
    "\u2028",
    "\x00",
    "\u00a0",
]
RUN = st.builds(lambda c, n: c * n, st.sampled_from(CHARS), st.integers(1, 300))
TEXT = st.lists(
    st.one_of(RUN, st.text(max_size=40, alphabet=st.characters(blacklist_categories=("Cs",)))), min_size=1, max_size=5
).map("".join)
KEY = st.one_of(st.sampled_from(["a", "city", "my-key"]), TEXT)


@st.composite
def preludes(draw) -> Prelude:
    keys = draw(st.lists(KEY, min_size=0, max_size=3, unique=True))
    props = {
        k: {
            "type": "string",
            "description": draw(TEXT),
            **({"enum": draw(st.lists(TEXT, min_size=1, max_size=2))} if draw(st.booleans()) else {}),
        }
        for k in keys
    }
    params = {"type": "object", "properties": props, "required": keys[: draw(st.integers(0, len(keys)))]}
    tools = [{"type": "function", "name": "f", "description": draw(TEXT), "parameters": params}]
    if draw(st.booleans()):
        tools.append({"type": "function", "name": "g", "description": draw(TEXT), "parameters": {"type": "object"}})
    return Prelude(
        instructions=draw(st.one_of(st.none(), TEXT)),
        tools=tuple(tools) if draw(st.booleans()) else (),
        tool_choice=draw(st.sampled_from(["auto", "required", "none"])),
    )


def harmony_direct(r: HarmonyRenderer, p: Prelude) -> list[int]:
    msgs = r.prelude_messages(p)
    opts = RenderOptions(conversation_has_function_tools=ToolCatalog(p.tools).has_functions)
    out = r._enc.render(msgs[0], opts)
    for m in msgs[1:]:
        out += r._enc.render(m)
    return out


@PROPS
@given(p=preludes())
def test_probe_rendering_equals_harmony(p: Prelude) -> None:
    r = HarmonyRenderer()
    assert r.render_prelude(p) == harmony_direct(r, p)


def test_the_probe_path_is_taken_for_long_text(monkeypatch) -> None:
    calls: list[bool] = []
    real = harmony_prelude.render_developer

    def spy(*a, **kw):
        out = real(*a, **kw)
        calls.append(out is not None)
        return out

    monkeypatch.setattr("inference.harmony_render.render_developer", spy)
    r = HarmonyRenderer()
    p = Prelude(
        instructions="word " * 100 + "中" * 500 + "\n" * 200,
        tools=(
            {
                "type": "function",
                "name": "f",
                "description": '"q" ' * 50 + "\n\n" + "x" * 300,
                "parameters": {"type": "object", "properties": {"k" * 80: {"type": "string"}}, "required": ["k" * 80]},
            },
        ),
    )
    assert r.render_prelude(p) == harmony_direct(r, p)
    assert calls == [True]
    short = Prelude(instructions="Be brief.")
    r.render_prelude(short)
    assert calls == [True]  # no long text: harmony's own path


@pytest.mark.parametrize("run", ["a", " ", "\n", "中", "😀", "!", "e\u0301", "\r\n", "ab"])
def test_a_megabyte_run_in_any_field_renders_and_round_trips(run: str) -> None:
    """1 MB runs: harmony panics (stack overflow) or takes minutes on these; ours are linear."""
    big = run * (1_000_000 // len(run.encode()))
    r = HarmonyRenderer()
    for p in (
        Prelude(instructions=big),
        Prelude(tools=({"type": "function", "name": "f", "description": big, "parameters": {"type": "object"}},)),
        Prelude(
            tools=(
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "string", "enum": [big]}}},
                },
            )
        ),
    ):
        ids = r.render_prelude(p)
        text = r._enc.decode(ids)
        lines = [ln.strip() for ln in big.splitlines() if ln.strip()]
        assert all(ln in text for ln in lines[:3]), run
        assert len(ids) <= 3 * len(big) + 5000  # harmony's "// " per description line at most


def test_runs_beyond_max_run_are_split_only_inside_the_run() -> None:
    from inference.harmony_core import encode_text

    enc = content_encoding()
    text = "Hello world. " + "x" * (3 * MAX_RUN + 7) + " and the rest."
    ids = encode_text(text)
    assert enc.decode(ids) == text
    assert ids[:3] == enc.encode_ordinary("Hello world.")[:3]
    assert encode_text("plain text " * 1000) == enc.encode_ordinary("plain text " * 1000)
