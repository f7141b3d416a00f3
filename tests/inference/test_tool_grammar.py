"""Custom tools' grammars as engine constraints (``inference.tool_grammar``): the JSON-string rewrite,
the chat-template constraints over a real tokenizer, and the fallback when a grammar cannot be
enforced. Harmony's constraints are in ``test_harmony_constraint.py``.

The grammar is Codex's own ``apply_patch`` Lark grammar, from a real Codex CLI frame."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr  # vLLM's structured-output backend, installed with the engine
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts

from inference.chat_template_render import ChatTemplateRenderer
from inference.renderer import Constraint, Prelude
from inference.tool_grammar import GrammarUnavailable, json_string_ebnf, tool_grammar
from tests.conftest import SHARED

FRAME = SHARED / "fixtures/codex/ws-apply-patch/002-ws_message.json"
CODEX_TOOLS = tuple(json.loads(FRAME.read_text())["body"]["tools"])
APPLY_PATCH = next(t for t in CODEX_TOOLS if t["type"] == "custom" and t["name"] == "apply_patch")
EXEC = next(t for t in CODEX_TOOLS if t.get("name") == "exec_command")
BAD_LARK = {
    "type": "custom",
    "name": "broken",
    "description": "x",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule"},
}

PATCHES = [
    "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n",
    '*** Begin Patch\n*** Update File: src/a.py\n@@ def f():\n-    return "a\\\\b"\n+    return \'\\t\' + "é ☃ 🎉"\n'
    "*** End of File\n*** End Patch",
    "*** Begin Patch\n*** Delete File: old.txt\n*** Update File: x\n*** Move to: y\n @@ ctx\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: ctrl\n+\x01\x1f\x7f\r\n*** End Patch\n",
]
NOT_PATCHES = [
    "",
    "hello",
    "*** Begin Patch\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: a\n+x\n",
    "*** Begin Patch\n*** Add File: a\n+x\n*** End Patch\n\n",
]


_LLG_TOKENIZER = None


def llguidance_accepts(lark: str, text: str) -> bool:
    """Whether ``text`` matches a Lark grammar, by llguidance — the grammar engine this dialect of
    Lark is written for (zero-width terminals such as Codex's ``/(.*)/``, which the ``lark`` package
    refuses), and an implementation independent of xgrammar's Lark conversion."""
    global _LLG_TOKENIZER
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from inference.model_assets import prepare_model

    if _LLG_TOKENIZER is None:
        _LLG_TOKENIZER = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(str(prepare_model("smollm2"))))
    matcher = llguidance.LLMatcher(_LLG_TOKENIZER, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
    return matcher.consume_tokens(_LLG_TOKENIZER.tokenize_str(text)) and matcher.is_accepting()


def escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


# -- the JSON-string rewrite --------------------------------------------------------------------


@pytest.mark.parametrize("text", PATCHES + NOT_PATCHES)
def test_the_json_grammar_accepts_exactly_the_escaped_spellings_of_the_raw_grammar(text):
    raw = tool_grammar(APPLY_PATCH)
    assert raw is not None and raw.syntax == "lark"
    esc = json_string_ebnf(raw.ebnf)
    want = text in PATCHES
    assert llguidance_accepts(APPLY_PATCH["format"]["definition"], text) is want  # the samples are right
    assert grammar_accepts(raw.ebnf, text) is want
    assert grammar_accepts(esc, escaped(text)) is want


def test_the_json_grammar_wants_canonical_escapes_and_no_raw_control_characters():
    esc = json_string_ebnf(tool_grammar(APPLY_PATCH).ebnf)
    ok = escaped(PATCHES[0])
    assert grammar_accepts(esc, ok)
    assert not grammar_accepts(esc, PATCHES[0])  # a raw newline cannot stand in a JSON string
    assert not grammar_accepts(esc, ok.replace("\\n", "\\u000a"))  # valid JSON, not what json.dumps writes
    assert not grammar_accepts(esc, escaped(PATCHES[1]).replace('\\"', '"'))  # an unescaped quote ends the string


def test_regex_grammars_and_classes_with_escaped_characters():
    tool = {
        "type": "custom",
        "name": "r",
        "format": {"type": "grammar", "syntax": "regex", "definition": r'say "[a-z\\]+"\t[^a-z]{2}'},
    }
    g = tool_grammar(tool)
    assert g is not None and g.syntax == "regex"
    esc = json_string_ebnf(g.ebnf)
    for text, want in [
        ('say "ab\\c"\t"\n', True),
        ('say "ab"\t12', True),
        ('say "AB"\t12', False),
        ('say "ab"\tab', False),
    ]:
        assert grammar_accepts(g.ebnf, text) is want, text
        assert grammar_accepts(esc, escaped(text)) is want, text


@pytest.mark.parametrize(
    "fmt, syntax",
    [
        ({"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule"}, "lark"),
        ({"type": "grammar", "syntax": "lark", "definition": "start: ("}, "lark"),
        ({"type": "grammar", "syntax": "regex", "definition": "(unclosed"}, "regex"),
        ({"type": "grammar", "syntax": "gbnf", "definition": 'root ::= "x"'}, "gbnf"),
        ({"type": "grammar", "syntax": "lark", "definition": ""}, "lark"),
    ],
)
def test_a_grammar_that_cannot_be_enforced_says_so_with_its_syntax(fmt, syntax):
    with pytest.raises(GrammarUnavailable) as err:
        tool_grammar({"type": "custom", "name": "t", "format": fmt})
    assert err.value.syntax == syntax


def test_tools_without_a_grammar_have_none():
    assert tool_grammar({"type": "custom", "name": "t"}) is None
    assert tool_grammar({"type": "custom", "name": "t", "format": {"type": "text"}}) is None


# -- chat-template constraints, fed token by token like vLLM's matcher --------------------------


@pytest.fixture(scope="module")
def ct_compiler(smollm2_renderer):  # the Qwen2.5 template under test runs on SmolLM2's tokenizer too
    info = xgr.TokenizerInfo.from_huggingface(
        smollm2_renderer.tokenizer, stop_token_ids=list(smollm2_renderer.stop_token_ids)
    )
    return xgr.GrammarCompiler(info)


def ct_accepts(compiler, renderer: ChatTemplateRenderer, constraint, ids: list[int]) -> bool:
    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(constraint["structural_tag"]))
    return all(matcher.accept_token(t) for t in ids) and matcher.is_terminated()


def completion(renderer: ChatTemplateRenderer, *items) -> list[int]:
    """What the model samples for ``items`` (the renderer's canonical form, ending in <|im_end|>)."""
    return renderer.render_completion(list(items))


def patch_call(text: str) -> dict:
    return {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": text}


def text_out(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


@pytest.mark.parametrize("choice", [{"type": "custom", "name": "apply_patch"}, "required", "auto"])
def test_chat_template_call_input_follows_the_grammar(ct_compiler, ct_renderer, choice):
    r = ct_renderer  # SmolLM2's emulated tool calls and Qwen2.5's native ones (same tokenizer)
    c = r.constraint(Prelude(tools=CODEX_TOOLS, tool_choice=choice), None)
    assert isinstance(c, Constraint) and c.fallbacks == () and "structural_tag" in c
    for patch in PATCHES:  # the renderer's own spelling of a valid call is accepted ...
        assert ct_accepts(ct_compiler, r, c, completion(r, patch_call(patch))), patch
    for bad in NOT_PATCHES:  # ... and a call whose input breaks the grammar is not
        assert not ct_accepts(ct_compiler, r, c, completion(r, patch_call(bad))), bad
    # another tool stays callable unless the choice names apply_patch
    call = {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": '{"cmd": "ls"}'}
    assert ct_accepts(ct_compiler, r, c, completion(r, call)) is (choice != {"type": "custom", "name": "apply_patch"})


def test_chat_template_auto_leaves_text_free_until_a_call_opens(ct_compiler, ct_renderer):
    r = ct_renderer
    c = r.constraint(Prelude(tools=CODEX_TOOLS, tool_choice="auto"), None)
    assert json.loads(c["structural_tag"])["format"]["type"] == "triggered_tags"
    assert ct_accepts(ct_compiler, r, c, completion(r, text_out("No patch needed: <b>done</b>.")))
    assert ct_accepts(ct_compiler, r, c, completion(r, text_out("Patching now."), patch_call(PATCHES[0])))
    assert not ct_accepts(ct_compiler, r, c, completion(r, text_out("Patching."), patch_call("rm -rf /")))
    # with no grammar tool offered, auto stays unconstrained
    assert r.constraint(Prelude(tools=(EXEC,), tool_choice="auto"), None) is None
    assert r.constraint(Prelude(tools=CODEX_TOOLS, tool_choice="none"), None) is None


def test_chat_template_grammar_that_cannot_be_enforced_falls_back_to_prose(smollm2_renderer):
    r = smollm2_renderer
    auto = r.constraint(Prelude(tools=(EXEC, BAD_LARK), tool_choice="auto"), None)
    assert auto == {} and not auto and auto.fallbacks == ("lark",)  # nothing to enforce, one fallback
    forced = r.constraint(Prelude(tools=(EXEC, BAD_LARK), tool_choice={"type": "custom", "name": "broken"}), None)
    assert forced.fallbacks == ("lark",)
    tag = json.loads(forced["structural_tag"])  # still one call to the tool, its input any JSON string
    assert tag["format"]["content"]["json_schema"]["properties"]["arguments"]["properties"]["input"]["type"] == "string"
    # the grammar is still in the tool's description, in prose
    assert "undefined_rule" in r.render_text([]) + r.prelude_text(Prelude(tools=(BAD_LARK,)))
