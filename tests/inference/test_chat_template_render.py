"""ChatTemplateRenderer: the incremental contract (property tests) and the rendering details, for
SmolLM2's own template and for Qwen2.5's template (tool-aware, joins consecutive tool results)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from inference.chat_template_profile import native_render
from inference.chat_template_render import ChatTemplateRenderer, TemplateError
from inference.hermes_tools import (
    FREEFORM_NOTE,
    NAMESPACE_SEP,
    TOOL_CHOICE_NONE,
    TOOL_CHOICE_REQUIRED,
    HermesToolCatalog,
    ToolNameCollision,
)
from inference.renderer import Prelude

from .chat_template_support import ALL_TOOLS, CONVERSATIONS, TEXT, call_index, model_outputs
from .harmony_support import GET_WEATHER, MCP, feed_all, items_from_events, random_sizes

PROPS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
PRELUDES = st.builds(
    Prelude,
    instructions=st.one_of(st.none(), TEXT),
    tools=st.lists(st.sampled_from(ALL_TOOLS), max_size=5, unique_by=id).map(tuple),
    tool_choice=st.sampled_from(["auto", "required", "none", {"type": "function", "name": "get_weather"}]),
)


def representable(r: ChatTemplateRenderer, text: str) -> bool:
    return r.tokenizer.decode(r._encode(text)) == text


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def out(call_id: str, text: str = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def call(call_id: str, name: str = "get_weather", args: str = '{"city": "Oslo"}') -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}


def answer(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


# -- the profiles: what probing found ----------------------------------------------------------


def test_smollm2_profile(smollm2_renderer: ChatTemplateRenderer) -> None:
    p = smollm2_renderer.profile
    tok = smollm2_renderer.tokenizer
    assert p.generation_prompt == "<|im_start|>assistant\n"
    assert tok.decode([p.end_token]) == "<|im_end|>" and tok.decode(list(p.post_tokens)) == "\n"
    assert smollm2_renderer.stop_token_ids == (p.end_token,)  # <|im_end|> is also SmolLM2's eos
    # a template without tool support: tools, calls and <tool_response> are emulated
    assert (p.native_tools, p.native_tool_calls, p.wraps_tool_response) == (False, False, False)
    assert p.tool_role == "tool" and not p.knows_developer and not p.reasoning
    assert p.default_system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert p.joins == frozenset() and p.decomposable


def test_qwen25_profile(qwen25_renderer: ChatTemplateRenderer) -> None:
    p = qwen25_renderer.profile
    assert (p.native_tools, p.native_tool_calls, p.wraps_tool_response) == (True, True, True)
    assert p.default_system.startswith("<|im_start|>system\nYou are Qwen")
    # consecutive tool results share one user turn: the only pair that is not per-message
    assert p.joins == frozenset({("tool", "tool")}) and p.decomposable
    assert any("(tool, tool)" in n for n in p.notes)


def test_not_decomposable_template_is_detected(smollm2_renderer: ChatTemplateRenderer) -> None:
    """A template that looks at ``loop.last`` for every message: appends are never claimed exact."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError):  # even the anchor is re-rendered when a message is added
        ChatTemplateRenderer(tokenizer=smollm2_renderer.tokenizer, chat_template=template)
    template = (  # only user messages look ahead: pairs (user, *) join, and a sample fails whole
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.role == 'user' and not loop.last and loop.index > 2 %} (answered){% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatTemplateRenderer(tokenizer=smollm2_renderer.tokenizer, chat_template=template)
    assert ("user", "assistant") in r.profile.joins
    assert r.append_break([user("a")], [answer("b")]) is not None


# -- (a) the incremental contract --------------------------------------------------------------


@PROPS
@given(items=CONVERSATIONS)
def test_append_equals_full_render_unless_reported(ct_renderer: ChatTemplateRenderer, items: list[dict]) -> None:
    """items(a) + items(b, calls of a) == items(a + b) exactly when append_break(a, b) is None."""
    full = ct_renderer.render_items(items)
    for i in range(len(items) + 1):
        head, tail = items[:i], items[i:]
        appended = ct_renderer.render_items(head) + ct_renderer.render_items(tail, calls=call_index(head))
        reason = ct_renderer.append_break(head, tail)
        assert (appended == full) == (reason is None), (i, reason)


@PROPS
@given(items=CONVERSATIONS, seed=st.integers(0, 2**32))
def test_append_over_many_turns(ct_renderer: ChatTemplateRenderer, items: list[dict], seed: int) -> None:
    """A chain of turns where the pipeline falls back to a full render whenever told to."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(len(items) + 1), k=min(len(items) + 1, 4)))
    tokens: list[int] = []
    prev = 0
    for cut in cuts + [len(items)]:
        if ct_renderer.append_break(items[:prev], items[prev:cut]) is None:
            tokens += ct_renderer.render_items(items[prev:cut], calls=call_index(items[:prev]))
        else:
            tokens = ct_renderer.render_items(items[:cut])
        prev = cut
    assert tokens == ct_renderer.render_items(items)


def test_where_append_is_not_exact(qwen25_renderer: ChatTemplateRenderer, smollm2_renderer) -> None:
    r = qwen25_renderer
    history = [user("hi"), call("1"), call("2", args="{}"), out("1")]
    assert r.append_break(history, [out("2")]) == "joined"  # Qwen closes the tool turn after the last result
    assert smollm2_renderer.append_break(history, [out("2")]) is None
    assert r.append_break(history, [user("more")]) is None
    # assistant-side items continue the assistant message they follow
    assert r.append_break([user("hi"), answer("Let me check.")], [call("1")]) == "assistant_turn"
    assert r.append_break([user("hi"), call("1")], [call("2")]) == "assistant_turn"
    assert r.append_break([user("hi"), call("1")], [answer("done")]) is None  # a new assistant message
    assert r.append_break([user("hi"), answer("a")], [answer("b")]) is None
    # items that render nothing are looked through
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]}
    assert r.append_break(history + [reasoning], [out("2")]) == "joined"
    assert r.append_break([], [out("2")]) is None


# -- (b) it is the template's own rendering ----------------------------------------------------


@PROPS
@given(prelude=PRELUDES, items=CONVERSATIONS)
def test_equals_the_template_rendering(ct_renderer: ChatTemplateRenderer, prelude: Prelude, items: list[dict]) -> None:
    r = ct_renderer
    catalog = HermesToolCatalog(prelude.tools)
    tools = catalog.schemas() if catalog and r.profile.native_tools else None
    head, msgs = r.prelude_messages(prelude), r.template_messages(items)
    ours = r.prelude_text(prelude) + r.render_text(items)
    if not head and (not msgs or msgs[0]["role"] == "system"):
        # documented deviation: the template would use a first system item *instead of* its default
        # system prompt (or render nothing at all); we keep the prelude and render the item after it
        sys_x = [{"role": "system", "content": "X"}]
        rest = native_render(r.tokenizer, r.template, sys_x + msgs, tools)
        assert ours == r.prelude_text(prelude) + rest[len(native_render(r.tokenizer, r.template, sys_x, tools)) :]
    else:
        assert ours == native_render(r.tokenizer, r.template, head + msgs, tools)
    assert r.render_prelude(prelude) + r.render_items(items) == r._encode(r.prelude_text(prelude)) + r.render_items(
        items
    )
    if not any(m["role"] == "assistant" and m["content"][:1].isspace() for m in msgs):
        # tokens are the tokenizer's tokens of the text (segment boundaries are special tokens)
        assert r.render_prelude(prelude) + r.render_items(items) == r._encode(ours)


def test_assistant_body_is_tokenized_after_the_generation_prompt(smollm2_renderer: ChatTemplateRenderer) -> None:
    r = smollm2_renderer
    tokens = r.render_items([answer("\n\nhi")])
    assert tokens[: len(r.generation_prompt())] == r.generation_prompt()
    assert r.tokenizer.decode(tokens) == "<|im_start|>assistant\n\n\nhi<|im_end|>\n"


# -- (c) the model's turn round-trips ----------------------------------------------------------


@PROPS
@given(outputs=model_outputs(), history=CONVERSATIONS, seed=st.integers(0, 2**32))
def test_model_turn_round_trips(
    ct_renderer: ChatTemplateRenderer, outputs: list[dict], history: list[dict], seed: int
) -> None:
    r = ct_renderer
    prelude = Prelude(tools=ALL_TOOLS)
    # the GGUF-converted SmolLM2 vocab lacks some byte tokens (e.g. for U+40000): such text is lost
    # by the tokenizer itself, before any rendering or parsing
    assume(representable(r, r.render_text(outputs)))
    sampled = r.render_completion(outputs)
    assert sampled[-1] in r.stop_token_ids
    parsed = items_from_events(feed_all(r.parser(prelude), sampled, random_sizes(seed, len(sampled))))
    assert parsed == outputs
    turn = r.generation_prompt() + r.history_tokens(sampled)
    assert turn == r.render_items(parsed)
    history = history + [user("next")]  # the model answers a user or tool turn
    if r.append_break(history, parsed) is None:
        assert r.render_items(history) + turn == r.render_items(history + parsed)


def test_reasoning_is_dropped_where_the_template_has_no_place_for_it(ct_renderer: ChatTemplateRenderer) -> None:
    """Reasoning items render nothing (SmolLM2, Qwen2.5); the model's <think> tokens still parse
    into a reasoning item and stay in the history verbatim, so (c) does not hold for them."""
    r = ct_renderer
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]}
    assert r.render_items([reasoning]) == []
    assert r.render_items([reasoning, answer("a")]) == r.render_items([answer("a")])
    sampled = r._encode("<think>\nhmm\n</think>\n\na") + [r.stop_token_ids[0]]
    parser = r.parser(Prelude())
    parsed = items_from_events(parser.feed(sampled) + parser.finish())
    assert parsed == [reasoning, answer("a")]
    assert r.generation_prompt() + r.history_tokens(sampled) != r.render_items(parsed)


# -- prelude -----------------------------------------------------------------------------------


def test_default_prelude_is_the_templates_default_system_prompt(ct_renderer: ChatTemplateRenderer) -> None:
    assert ct_renderer.prelude_text(Prelude()) == ct_renderer.profile.default_system
    assert ct_renderer.prelude_messages(Prelude(tools=({"type": "web_search"},))) == []


def test_prelude_with_instructions_and_tools(ct_renderer: ChatTemplateRenderer) -> None:
    text = ct_renderer.prelude_text(Prelude(instructions="Be brief.", tools=ALL_TOOLS, tool_choice="required"))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n" + TOOL_CHOICE_REQUIRED)
    assert text.endswith("</tool_call><|im_end|>\n") and text.count("<|im_start|>") == 1
    assert '"name": "get_weather"' in text and '"name": "ping"' in text
    assert f'"name": "mcp_fs{NAMESPACE_SEP}read_file"' in text and f'"name": "mcp_fs{NAMESPACE_SEP}write_raw"' in text
    assert '"name": "apply_patch"' in text and '"required": ["input"]' in text
    assert "Begin Patch" in text and "A filesystem MCP server." in text
    assert "web_search" not in text and "You are Qwen" not in text and "SmolLM" not in text


def test_qwen_default_system_with_tools(qwen25_renderer: ChatTemplateRenderer) -> None:
    text = qwen25_renderer.prelude_text(Prelude(tools=(GET_WEATHER,)))
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.") and "# Tools" in text


@pytest.mark.parametrize(
    "choice,line",
    [
        ("required", TOOL_CHOICE_REQUIRED),
        ("none", TOOL_CHOICE_NONE),
        ({"type": "function", "name": "get_weather"}, "You must call the tool `get_weather`."),
        (
            {"type": "function", "name": "read_file", "namespace": "mcp_fs"},
            "You must call the tool `mcp_fs__read_file`.",
        ),
    ],
)
def test_tool_choice_line(ct_renderer: ChatTemplateRenderer, choice, line: str) -> None:
    assert line in ct_renderer.prelude_text(Prelude(tools=(GET_WEATHER, MCP), tool_choice=choice))
    assert line not in ct_renderer.prelude_text(Prelude(tool_choice=choice))  # no tools, no line


def test_prelude_key_tracks_what_reaches_the_prompt(
    ct_renderer: ChatTemplateRenderer, smollm2_renderer, qwen25_renderer
) -> None:
    base = Prelude(instructions="x", tools=(GET_WEATHER,), tool_choice="auto")
    key = ct_renderer.prelude_key(base)
    for variant in (
        Prelude(instructions="y", tools=(GET_WEATHER,)),
        Prelude(instructions="x", tools=(GET_WEATHER, MCP)),
        Prelude(instructions="x", tools=(GET_WEATHER,), tool_choice="required"),
        Prelude(instructions="x"),
    ):
        assert ct_renderer.prelude_key(variant) != key
    assert (
        ct_renderer.prelude_key(Prelude(instructions="x", tools=(dict(GET_WEATHER),), reasoning_effort="high")) == key
    )
    assert smollm2_renderer.prelude_key(base) != qwen25_renderer.prelude_key(base)  # the template is in the key
    assert ct_renderer.render_prelude(base) == ct_renderer.render_prelude(base)  # cached copy


def test_tool_name_collision_is_rejected(ct_renderer: ChatTemplateRenderer) -> None:
    clash = {"type": "function", "name": "mcp_fs__read_file", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(ToolNameCollision, match="mcp_fs__read_file"):
        ct_renderer.render_prelude(Prelude(tools=(MCP, clash)))
    with pytest.raises(ToolNameCollision):
        ct_renderer.parser(Prelude(tools=(GET_WEATHER, GET_WEATHER)))


# -- items -------------------------------------------------------------------------------------


def test_item_rendering_smollm2(smollm2_renderer: ChatTemplateRenderer) -> None:
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "look"}, {"type": "input_image"}],
        },
        {"type": "message", "role": "developer", "content": "dev note"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}]},
        answer("Checking."),
        call("1"),
        {"type": "function_call", "call_id": "2", "name": "read_file", "namespace": "mcp_fs", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "3", "name": "apply_patch", "input": '*** Begin Patch\n"q"'},
        out("1", "cold"),
        {"type": "custom_tool_call_output", "call_id": "3", "output": "Done"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"type": "item_reference", "id": "x"},
    ]
    assert smollm2_renderer.render_text(items) == (
        "<|im_start|>user\nlook[image]<|im_end|>\n"
        "<|im_start|>system\ndev note<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mcp_fs__read_file", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n\\"q\\""}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\ncold\n</tool_response><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\nDone\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nNo.<|im_end|>\n"
    )


def test_item_rendering_qwen25(qwen25_renderer: ChatTemplateRenderer) -> None:
    items = [user("hi"), call("1"), call("2", args="not json"), out("1", "cold"), out("2", "warm"), answer("ok")]
    assert qwen25_renderer.render_text(items) == (
        "<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": "not json"}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )


def test_tool_output_needs_no_call_in_scope(ct_renderer: ChatTemplateRenderer) -> None:
    """Hermes templates do not print the tool name, so an output renders without its call."""
    assert ct_renderer.render_items([out("zz")]) == ct_renderer.render_items([out("zz")], calls={"zz": call("zz")})


def test_freeform_note_in_custom_tool_description(ct_renderer: ChatTemplateRenderer) -> None:
    assert FREEFORM_NOTE.replace("`", "") in ct_renderer.prelude_text(Prelude(tools=ALL_TOOLS)).replace("`", "")


# -- generation --------------------------------------------------------------------------------


def test_generation_prompt_history_tokens_and_stops(ct_renderer: ChatTemplateRenderer) -> None:
    r = ct_renderer
    tok = r.tokenizer
    assert tok.decode(r.generation_prompt()) == "<|im_start|>assistant\n"
    im_end = r.stop_token_ids[0]
    sampled = r._encode("Hello") + [im_end]
    assert tok.decode(r.history_tokens(sampled)) == "Hello<|im_end|>\n"
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    other = ChatTemplateRenderer(tokenizer=tok, chat_template=r.template)
    object.__setattr__(other, "stop_token_ids", (im_end, eos))
    assert tok.decode(other.history_tokens(r._encode("Hello") + [eos])) == "Hello<|im_end|>\n"
    cut = r._encode("Hello wor")
    assert r.history_tokens(cut) == cut and r.history_tokens([]) == []


def test_count_text_tokens(ct_renderer: ChatTemplateRenderer) -> None:
    assert ct_renderer.count_text_tokens("") == 0
    assert ct_renderer.count_text_tokens("hello world") == len(ct_renderer._encode("hello world")) > 0


def test_render_completion_rejects_non_assistant_items(ct_renderer: ChatTemplateRenderer) -> None:
    with pytest.raises(ValueError):
        ct_renderer.render_completion([user("x")])


# -- engine constraints ------------------------------------------------------------------------


def test_constraint(ct_renderer: ChatTemplateRenderer) -> None:
    import json

    import xgrammar

    r = ct_renderer
    tools = (GET_WEATHER, MCP)
    required = json.loads(r.constraint(Prelude(tools=tools, tool_choice="required"), None)["structural_tag"])
    fmt = required["format"]
    assert (fmt["type"], fmt["begin"], fmt["end"]) == ("tag", "<tool_call>\n", "\n</tool_call>")
    names = [alt["properties"]["name"]["const"] for alt in fmt["content"]["json_schema"]["anyOf"]]
    assert names == ["get_weather", "mcp_fs__read_file", "mcp_fs__write_raw"]
    # each alternative carries that tool's own parameter schema: arguments are schema-valid
    weather = fmt["content"]["json_schema"]["anyOf"][0]["properties"]["arguments"]
    assert weather == GET_WEATHER["parameters"]
    xgrammar.Grammar.from_structural_tag(json.dumps(required))  # compiles
    named = json.loads(
        r.constraint(
            Prelude(tools=tools, tool_choice={"type": "function", "name": "read_file", "namespace": "mcp_fs"}), None
        )["structural_tag"]
    )
    assert named["format"]["content"]["json_schema"]["properties"]["name"] == {"const": "mcp_fs__read_file"}
    assert r.constraint(Prelude(tools=tools), None) is None
    assert r.constraint(Prelude(tools=tools, tool_choice="none"), None) is None
    assert r.constraint(Prelude(tool_choice="required"), None) is None  # no tools, nothing to call
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert r.constraint(Prelude(), {"type": "json_schema", "name": "x", "schema": schema}) == {"json": schema}
    assert r.constraint(Prelude(), {"type": "json_object"}) == {"json_object": True}
    # a forced call wins over a text format (the answer is the call)
    assert "structural_tag" in r.constraint(Prelude(tools=tools, tool_choice="required"), {"type": "json_object"})


def test_a_megabyte_run_is_tokenized_in_segments_with_the_same_text(ct_renderer: ChatTemplateRenderer) -> None:
    """inference/text_runs.py: runs over MAX_RUN are cut (HF tokenizers is superlinear on them and
    holds the GIL); shorter text tokenizes exactly as one call would."""
    from inference.text_runs import MAX_RUN

    normal = "Some ordinary text, with punctuation.\n" * 500
    assert ct_renderer._encode(normal) == ct_renderer._fast.encode(normal, add_special_tokens=False).ids
    big = "Header " + "中" * 1_000_000 + " tail"
    ids = ct_renderer._encode(big)
    assert ct_renderer._fast.decode(ids) == big
    assert ct_renderer._encode("x" * MAX_RUN) == ct_renderer._fast.encode("x" * MAX_RUN, add_special_tokens=False).ids
