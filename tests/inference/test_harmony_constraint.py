"""Harmony structured-output constraints, enforced the way vLLM enforces them: an xgrammar
matcher over the o200k_harmony vocabulary fed the model's tokens one by one."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr  # vLLM's structured-output backend, installed with the engine

from inference.harmony_core import harmony_encoding
from inference.harmony_render import HarmonyRenderer
from inference.renderer import Prelude

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
NS = {
    "type": "namespace",
    "name": "fs",
    "description": "Files.",
    "tools": [
        {
            "type": "function",
            "name": "read",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        }
    ],
}


@pytest.fixture(scope="module")
def compiler():
    import tiktoken

    from inference.vocab import ensure_offline_vocab

    ensure_offline_vocab()
    enc = tiktoken.get_encoding("o200k_harmony")  # the vocabulary gpt-oss (and harmony) use
    vocab = []
    for i in range(enc.n_vocab):
        try:
            vocab.append(enc.decode_single_token_bytes(i))
        except KeyError:  # reserved ids with no token
            vocab.append(b"")
    # gpt-oss's generation config ends generation at <|return|> and <|call|>
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[200002, 200012])
    return xgr.GrammarCompiler(info)


def accepts(compiler, constraint: dict, completion: str) -> bool:
    """Feed the canonical tokens of ``completion`` (what follows ``<|start|>assistant``)."""
    ctx = compiler.compile_structural_tag(constraint["structural_tag"])
    matcher = xgr.GrammarMatcher(ctx)
    ids = harmony_encoding().encode(completion, allowed_special="all")
    return all(matcher.accept_token(t) for t in ids) and matcher.is_terminated()


def test_the_terminator_is_only_accepted_once_the_arguments_are_complete(compiler, renderer):
    c = renderer.constraint(Prelude(tools=(WEATHER,), tool_choice="required"), None)
    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(c["structural_tag"]))
    head = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"'
    for t in harmony_encoding().encode(head, allowed_special="all"):
        assert matcher.accept_token(t)
    assert not matcher.accept_token(200012)  # <|call|> before "unit" is refused


@pytest.fixture(scope="module")
def renderer():
    return HarmonyRenderer()


def test_required_call_accepts_schema_valid_calls_with_or_without_reasoning(compiler, renderer):
    c = renderer.constraint(Prelude(tools=(WEATHER, CLOCK), tool_choice="required"), None)
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "c"}<|call|>'  # noqa: E501 (a token string as the model writes it)
    assert accepts(compiler, c, call)
    assert accepts(compiler, c, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + call)
    assert accepts(compiler, c, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>")


@pytest.mark.parametrize(
    "completion",
    [
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "k"}<|call|>',  # noqa: E501 (a token string as the model writes it)
        "<|channel|>final<|message|>It is sunny.<|return|>",
        "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>",
    ],
)
def test_required_call_rejects_invalid_arguments_answers_and_unknown_tools(compiler, renderer, completion):
    c = renderer.constraint(Prelude(tools=(WEATHER, CLOCK), tool_choice="required"), None)
    assert not accepts(compiler, c, completion)


def test_named_function_and_namespace_recipient(compiler, renderer):
    c = renderer.constraint(
        Prelude(tools=(WEATHER, NS), tool_choice={"type": "function", "name": "read", "namespace": "fs"}), None
    )
    assert accepts(
        compiler, c, '<|channel|>commentary to=fs.read <|constrain|>json<|message|>{"path": "a.txt"}<|call|>'
    )
    assert not accepts(
        compiler,
        c,
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "unit": "c"}<|call|>',
    )


def test_json_schema_text_format_constrains_the_final_channel(compiler, renderer):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    c = renderer.constraint(Prelude(), {"type": "json_schema", "name": "x", "schema": schema})
    assert accepts(compiler, c, '<|channel|>final<|message|>{"n": 3}<|return|>')
    assert not accepts(compiler, c, '<|channel|>final<|message|>{"n": "three"}<|return|>')
    assert json.loads(c["structural_tag"])["type"] == "structural_tag"


def test_no_constraint_for_auto_or_plain_text(renderer):
    assert renderer.constraint(Prelude(tools=(WEATHER,)), None) is None
    assert renderer.constraint(Prelude(tools=(WEATHER,), tool_choice="none"), None) is None
    assert renderer.constraint(Prelude(), {"type": "text"}) is None


# -- custom tools with a grammar (Codex's apply_patch, from a real Codex frame) ------------------

from tests.inference.test_tool_grammar import BAD_LARK, CODEX_TOOLS, NOT_PATCHES, PATCHES  # noqa: E402

PATCH_HEAD = "<|channel|>commentary to=functions.apply_patch<|message|>"
THINK = "<|channel|>analysis<|message|>The user wants a file.<|end|><|start|>assistant"


@pytest.mark.parametrize("choice", [{"type": "custom", "name": "apply_patch"}, "required", "auto"])
def test_custom_call_content_follows_its_grammar(compiler, renderer, choice):
    c = renderer.constraint(Prelude(tools=CODEX_TOOLS, tool_choice=choice), None)
    assert c.fallbacks == ()
    for patch in PATCHES:
        assert accepts(compiler, c, PATCH_HEAD + patch + "<|call|>"), patch
        assert accepts(compiler, c, THINK + PATCH_HEAD + patch + "<|call|>"), patch
    for bad in NOT_PATCHES:
        assert not accepts(compiler, c, PATCH_HEAD + bad + "<|call|>"), bad
        assert not accepts(compiler, c, THINK + PATCH_HEAD + bad + "<|call|>"), bad
    # the renderer's own tokens for the call (what the history holds) are what the constraint accepts
    call = {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": PATCHES[1]}
    ids, gp = renderer.render_items([call]), renderer.generation_prompt()
    assert ids[: len(gp)] == gp
    m = xgr.GrammarMatcher(compiler.compile_structural_tag(c["structural_tag"]))
    assert all(m.accept_token(t) for t in ids[len(gp) :]) and m.is_terminated()


def test_auto_with_a_grammar_tool_leaves_everything_else_free(compiler, renderer):
    c = renderer.constraint(Prelude(tools=CODEX_TOOLS, tool_choice="auto"), None)
    exec_call = '<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>{"cmd": "ls"}<|call|>'
    for ok in [
        "<|channel|>final<|message|>Done, no patch needed.<|return|>",
        THINK + "<|channel|>final<|message|>Hi<|return|>",
        exec_call,
        THINK + exec_call,
        "<|channel|>commentary<|message|>Patching.<|end|><|start|>assistant" + PATCH_HEAD + PATCHES[0] + "<|call|>",
        " to=functions.apply_patch<|channel|>commentary<|message|>" + PATCHES[0] + "<|call|>",
    ]:
        assert accepts(compiler, c, ok), ok
    assert not accepts(compiler, c, " to=functions.apply_patch<|channel|>commentary<|message|>oops<|call|>")
    assert not accepts(compiler, c, PATCH_HEAD[: -len("<|message|>")] + " <|constrain|>json<|message|>{}<|call|>")
    # no grammar tool offered: auto stays unconstrained, as before
    assert renderer.constraint(Prelude(tools=(WEATHER,), tool_choice="auto"), None) is None


def test_a_grammar_that_cannot_be_enforced_falls_back_and_says_so(compiler, renderer):
    auto = renderer.constraint(Prelude(tools=(WEATHER, BAD_LARK)), None)
    assert not auto and auto.fallbacks == ("lark",)
    forced = renderer.constraint(
        Prelude(tools=(WEATHER, BAD_LARK), tool_choice={"type": "custom", "name": "broken"}), None
    )
    assert forced.fallbacks == ("lark",)  # still one call to the tool, its content free
    assert accepts(compiler, forced, "<|channel|>commentary to=functions.broken<|message|>anything at all<|call|>")
    assert not accepts(compiler, forced, "<|channel|>final<|message|>no call<|return|>")
