"""Harmony structured-output constraints, enforced the way vLLM enforces them: an xgrammar
matcher over the o200k_harmony vocabulary fed the model's tokens one by one."""

from __future__ import annotations

import json

import pytest

import xgrammar as xgr  # vLLM's structured-output backend, installed with the engine

from inference.harmony_core import harmony_encoding
from inference.harmony_render import HarmonyRenderer
from inference.render import Prelude

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
NS = {"type": "namespace", "name": "fs", "description": "Files.", "tools": [
    {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}]}


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
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "c"}<|call|>'
    assert accepts(compiler, c, call)
    assert accepts(compiler, c, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + call)
    assert accepts(compiler, c, '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>')


@pytest.mark.parametrize("completion", [
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "k"}<|call|>',
    '<|channel|>final<|message|>It is sunny.<|return|>',
    '<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>',
])
def test_required_call_rejects_invalid_arguments_answers_and_unknown_tools(compiler, renderer, completion):
    c = renderer.constraint(Prelude(tools=(WEATHER, CLOCK), tool_choice="required"), None)
    assert not accepts(compiler, c, completion)


def test_named_function_and_namespace_recipient(compiler, renderer):
    c = renderer.constraint(Prelude(tools=(WEATHER, NS), tool_choice={"type": "function", "name": "read",
                                                                      "namespace": "fs"}), None)
    assert accepts(compiler, c, '<|channel|>commentary to=fs.read <|constrain|>json<|message|>{"path": "a.txt"}<|call|>')
    assert not accepts(compiler, c, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                                    '{"city": "Paris", "unit": "c"}<|call|>')


def test_json_schema_text_format_constrains_the_final_channel(compiler, renderer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    c = renderer.constraint(Prelude(), {"type": "json_schema", "name": "x", "schema": schema})
    assert accepts(compiler, c, '<|channel|>final<|message|>{"n": 3}<|return|>')
    assert not accepts(compiler, c, '<|channel|>final<|message|>{"n": "three"}<|return|>')
    assert json.loads(c["structural_tag"])["type"] == "structural_tag"


def test_no_constraint_for_auto_or_plain_text(renderer):
    assert renderer.constraint(Prelude(tools=(WEATHER,)), None) is None
    assert renderer.constraint(Prelude(tools=(WEATHER,), tool_choice="none"), None) is None
    assert renderer.constraint(Prelude(), {"type": "text"}) is None
