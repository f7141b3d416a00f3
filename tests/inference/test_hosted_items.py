"""Remote MCP items in the conversation (``inference.hosted_items``): both renderer families show
the model an MCP tool exactly as a namespace function tool, and keep the incremental contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.chat_template_render import ChatTemplateRenderer
from inference.harmony import HarmonyRenderer, UnknownCallError, render_completion
from inference.hermes_tools import flat_name
from inference.hosted_items import DENIED, NO_RESULT, call_of, error_text, output_of, tool_view
from inference.item_types import MCP_ITEM_TYPES, ItemType
from inference.parse import ItemDelta, ItemStart
from inference.renderer import Prelude

from . import chat_template_support as cts
from . import harmony_support as hs

PROPS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

LABEL = "deepwiki"
#: an MCP server's tools as the gateway offers them: a namespace tool named by the server label
SERVER = {
    "type": "namespace",
    "name": LABEL,
    "description": "",
    "tools": [
        {
            "type": "function",
            "name": "ask_question",
            "description": "Ask a question about a repository.",
            "parameters": {
                "type": "object",
                "properties": {"repoName": {"type": "string"}, "question": {"type": "string"}},
                "required": ["repoName", "question"],
            },
            "strict": False,
        },
        {
            "type": "function",
            "name": "read_wiki_structure",
            "description": "List a repository's wiki topics.",
            "parameters": {"type": "object", "properties": {"repoName": {"type": "string"}}},
            "strict": False,
        },
    ],
}
PRELUDE = Prelude(instructions="Use the tools.", tools=(hs.GET_WEATHER, hs.MCP, SERVER))
ARGS = '{"repoName": "openai/codex", "question": "What is it?"}'


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def mcp_call(id_: str, output: str | None = "ok", **extra: Any) -> dict:
    item = {"type": "mcp_call", "id": id_, "server_label": LABEL, "name": "ask_question", "arguments": ARGS}
    if output is not None:
        item["output"] = output
    return item | extra


def approval_request(id_: str, name: str = "ask_question", args: str = ARGS) -> dict:
    return {"type": "mcp_approval_request", "id": id_, "server_label": LABEL, "name": name, "arguments": args}


def approval_response(request_id: str, approve: bool, reason: str | None = None) -> dict:
    item: dict = {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": approve}
    if reason is not None:
        item["reason"] = reason
    return item


def fn_call(call_id: str, name: str = "ask_question", args: str = ARGS) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "namespace": LABEL, "arguments": args}


def fn_output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def call_index(items: list[dict]) -> dict[str, dict]:
    """The chain's call lookup as the gateway keeps it: client calls by ``call_id``, and each MCP
    item's call (approval requests above all) by its ``id``, as :func:`call_of` gives it."""
    index = hs.call_index(it for it in items if it["type"] not in MCP_ITEM_TYPES)
    for it in items:
        call = call_of(it)
        if call is not None:
            index[call["call_id"]] = call
    return index


# -- conversations mixing messages, client calls and MCP items ----------------------------------

NAMES = st.sampled_from(["ask_question", "read_wiki_structure"])
ERRORS = st.one_of(
    st.none(),
    hs.TEXT,
    st.builds(lambda c, m: {"type": "http_error", "code": c, "message": m}, st.integers(400, 599), st.just("down")),
    st.builds(lambda t: {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": t}]}, hs.TEXT),
)


@st.composite
def _episode(draw: st.DrawFn, n: int, text: st.SearchStrategy[str]) -> tuple[list[dict], list[dict]]:
    """One MCP exchange as (items at one point, items at a later point)."""
    kind = draw(st.sampled_from(["list", "call", "error", "approved", "denied", "pending"]))
    name, args = draw(NAMES), draw(cts.JSON_ARGS)
    call = {"type": "mcp_call", "id": f"mcp_{n}", "server_label": LABEL, "name": name, "arguments": args}
    if kind == "list":
        return [{"type": "mcp_list_tools", "id": f"mcpl_{n}", "server_label": LABEL, "tools": []}], []
    if kind == "call":
        return [call | {"output": draw(text)}], []
    if kind == "error":
        return [call | {"error": draw(ERRORS), "status": "failed"}], []
    request = approval_request(f"mcpr_{n}", name, args)
    if kind == "pending":
        return [request], []
    if kind == "denied":
        return [request], [approval_response(request["id"], False, draw(st.none() | text))]
    done = call | {"approval_request_id": request["id"]}
    done |= {"output": draw(text)} if draw(st.booleans()) else {"error": draw(ERRORS)}
    return [request], [approval_response(request["id"], True), done]


@st.composite
def with_mcp(draw: st.DrawFn, base: st.SearchStrategy[list[dict]], text: st.SearchStrategy[str]) -> list[dict]:
    """A conversation of ``base`` with MCP exchanges inserted (an approval's answer after its request)."""
    items = draw(base)
    slots: dict[int, list[dict]] = {}
    for n in range(draw(st.integers(1, 4))):
        now, later = draw(_episode(n, text))
        i = draw(st.integers(0, len(items)))
        slots.setdefault(i, []).extend(now)
        if later:
            slots.setdefault(draw(st.integers(i, len(items))), []).extend(later)
    out: list[dict] = []
    for i in range(len(items) + 1):
        out += slots.get(i, [])
        if i < len(items):
            out.append(items[i])
    return out


HARMONY_CONVERSATIONS = with_mcp(hs.CONVERSATIONS, hs.TEXT)
CT_CONVERSATIONS = with_mcp(cts.CONVERSATIONS, cts.TEXT)


# -- (a) the incremental contract holds with MCP items ------------------------------------------


@PROPS
@given(items=HARMONY_CONVERSATIONS)
def test_harmony_append_equals_full_render(renderer: HarmonyRenderer, items: list[dict]) -> None:
    pre = renderer.render_prelude(PRELUDE)
    full = pre + renderer.render_items(items)
    for i in range(len(items) + 1):
        head, tail = items[:i], items[i:]
        assert pre + renderer.render_items(head) + renderer.render_items(tail, calls=call_index(head)) == full, i


@PROPS
@given(items=HARMONY_CONVERSATIONS, cuts=st.lists(st.integers(0, 40), max_size=4))
def test_harmony_append_over_many_turns(renderer: HarmonyRenderer, items: list[dict], cuts: list[int]) -> None:
    tokens = renderer.render_prelude(PRELUDE)
    prev = 0
    for cut in sorted({min(c, len(items)) for c in cuts}) + [len(items)]:
        tokens += renderer.render_items(items[prev:cut], calls=call_index(items[:prev]))
        prev = cut
    assert tokens == renderer.render_prelude(PRELUDE) + renderer.render_items(items)


@PROPS
@given(items=CT_CONVERSATIONS)
def test_chat_template_append_equals_full_render_unless_reported(
    ct_renderer: ChatTemplateRenderer, items: list[dict]
) -> None:
    """Exact exactly when ``append_break`` says so, and ``append_break`` judges MCP items as what
    they stand for (the same answer as on the expanded items)."""
    r = ct_renderer
    pre = r.render_prelude(PRELUDE)
    full = pre + r.render_items(items)
    for i in range(len(items) + 1):
        head, tail = items[:i], items[i:]
        appended = pre + r.render_items(head) + r.render_items(tail, calls=call_index(head))
        reason = r.append_break(head, tail)
        assert reason == r.append_break(list(tool_view(head)), list(tool_view(tail))), i
        assert (appended == full) == (reason is None), (i, reason)


# -- an MCP tool is a namespace function tool to the model --------------------------------------


def _equivalents() -> list[tuple[list[dict], list[dict]]]:
    """(MCP items, the namespace function items the model saw for them)."""
    return [
        ([user("q"), mcp_call("mcp_1", "an answer")], [user("q"), fn_call("mcp_1"), fn_output("mcp_1", "an answer")]),
        (
            [mcp_call("mcp_2", None, error="server down", status="failed")],
            [fn_call("mcp_2"), fn_output("mcp_2", "Error: server down")],
        ),
        ([mcp_call("mcp_3", None, status="incomplete")], [fn_call("mcp_3"), fn_output("mcp_3", NO_RESULT)]),
        (
            [
                {"type": "mcp_list_tools", "id": "l", "server_label": LABEL, "tools": [{"name": "ask_question"}]},
                approval_request("r1"),
                approval_response("r1", True),
                mcp_call("mcp_4", "approved answer", approval_request_id="r1"),
            ],
            [fn_call("r1"), fn_output("r1", "approved answer")],
        ),
        (
            [approval_request("r2"), approval_response("r2", False)],
            [fn_call("r2"), fn_output("r2", DENIED)],
        ),
        (
            [approval_request("r3"), approval_response("r3", False, "not now")],
            [fn_call("r3"), fn_output("r3", DENIED + " Reason: not now")],
        ),
    ]


@pytest.mark.parametrize("mcp,canonical", _equivalents())
def test_mcp_items_render_as_namespace_function_items(
    renderer: HarmonyRenderer, ct_renderer: ChatTemplateRenderer, mcp: list[dict], canonical: list[dict]
) -> None:
    for r in (renderer, ct_renderer):
        assert r.render_items(mcp) == r.render_items(canonical)
        assert r.render_items(canonical)  # not vacuous


def test_harmony_shows_the_server_label_as_the_namespace(renderer: HarmonyRenderer, enc) -> None:
    text = enc.decode(renderer.render_items([mcp_call("mcp_1", "an answer")]))
    assert text == (
        f"<|start|>assistant<|channel|>commentary to={LABEL}.ask_question <|constrain|>json<|message|>{ARGS}<|call|>"
        f"<|start|>{LABEL}.ask_question<|channel|>commentary to=assistant<|message|>an answer<|end|>"
    )
    # the recipient is the one the prelude declares and the parser maps back to the namespace
    prelude = enc.decode(renderer.render_prelude(PRELUDE))
    assert f"namespace {LABEL} {{" in prelude and "type ask_question = (_: {" in prelude
    assert renderer._catalogs(PRELUDE.tools).split_recipient(f"{LABEL}.ask_question") == ("ask_question", LABEL)


def test_chat_template_names_the_flattened_tool(ct_renderer: ChatTemplateRenderer) -> None:
    text = ct_renderer.render_text([mcp_call("mcp_1", "an answer")])
    assert f'"name": "{LABEL}__ask_question"' in text and "<tool_response>\nan answer\n</tool_response>" in text
    assert f'"name": "{LABEL}__ask_question"' in ct_renderer.prelude_text(PRELUDE)


def test_an_output_names_its_tool_without_a_call_lookup(
    renderer: HarmonyRenderer, ct_renderer: ChatTemplateRenderer
) -> None:
    """An approved call's output, in a turn after its approval request: the item itself names the
    tool (no lookup needed); a refusal needs the request, from the earlier items or ``calls``."""
    done = mcp_call("mcp_9", "fine", approval_request_id="r9")
    tail = renderer.render_items([approval_request("r9"), done])[len(renderer.render_items([approval_request("r9")])) :]
    assert renderer.render_items([done]) == tail
    (msg,) = ct_renderer.template_messages([done])
    assert msg["name"] == flat_name("ask_question", LABEL)
    denied = approval_response("r9", False)
    with pytest.raises(UnknownCallError):
        renderer.render_items([denied])
    expected = renderer.render_items([approval_request("r9"), denied])
    assert (
        renderer.render_items([approval_request("r9")])
        + renderer.render_items([denied], calls=call_index([approval_request("r9")]))
        == expected
    )


@pytest.mark.parametrize("family", ["harmony", "chat_template"])
def test_a_tool_loop_appends_only_the_output_after_the_models_call(
    renderer: HarmonyRenderer, ct_renderer: ChatTemplateRenderer, family: str
) -> None:
    """The model's canonical call tokens, then the rendered :func:`output_of` (what a tool loop
    appends at the token tip), are the rendering of the finished ``mcp_call``."""
    r = renderer if family == "harmony" else ct_renderer
    done = mcp_call("mcp_5", "the answer")
    call = call_of(done)
    assert call is not None
    sampled = (
        render_completion(renderer.item_messages([call])) if r is renderer else ct_renderer.render_completion([call])
    )
    out = output_of(done)
    assert out is not None and output_of(approval_request("r")) is None
    assert r.generation_prompt() + r.history_tokens(sampled) + r.render_items([out]) == r.render_items([done])


# -- the parser maps the model's call back to the server ----------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_harmony_parser_round_trip(renderer: HarmonyRenderer, seed: int) -> None:
    call = call_of(approval_request("r1"))
    sampled = render_completion(renderer.item_messages([call]))
    events = hs.feed_all(renderer.parser(PRELUDE), sampled, hs.random_sizes(seed, len(sampled)))
    _assert_call_events(events)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chat_template_parser_round_trip(ct_renderer: ChatTemplateRenderer, seed: int) -> None:
    call = call_of(approval_request("r1"))
    sampled = ct_renderer.render_completion([call])
    events = hs.feed_all(ct_renderer.parser(PRELUDE), sampled, hs.random_sizes(seed, len(sampled)))
    _assert_call_events(events)


def _assert_call_events(events: list) -> None:
    starts = [(ev.kind, ev.name, ev.namespace) for ev in events if isinstance(ev, ItemStart)]
    assert starts == [("function_call", "ask_question", LABEL)]
    assert json.loads("".join(ev.text for ev in events if isinstance(ev, ItemDelta))) == json.loads(ARGS)


# -- tool_view itself ----------------------------------------------------------------------------


def test_tool_view_returns_the_same_object_without_mcp_items() -> None:
    items = [user("a"), fn_call("c"), fn_output("c", "x"), {"type": "reasoning", "summary": []}]
    assert tool_view(items) is items
    as_tuple = tuple(items)
    assert tool_view(as_tuple) is as_tuple
    empty: list[dict] = []
    assert tool_view(empty) is empty


def test_tool_view_expands_without_touching_its_input() -> None:
    items = [user("a"), mcp_call("m", "x"), {"type": "mcp_list_tools", "id": "l", "server_label": LABEL, "tools": []}]
    before = json.dumps(items)
    view = tool_view(items)
    assert view is not items and json.dumps(items) == before
    assert [it["type"] for it in view] == ["message", ItemType.FUNCTION_CALL, ItemType.FUNCTION_CALL_OUTPUT]
    assert view[2] == {
        "type": "function_call_output",
        "call_id": "m",
        "output": "x",
        "name": "ask_question",
        "namespace": LABEL,
    }
    assert call_of(mcp_call("m", "x", approval_request_id="r")) is None  # its call is the request's
    assert call_of(user("a")) is None


@pytest.mark.parametrize(
    "error,text",
    [
        ("boom", "Error: boom"),
        ({"type": "http_error", "code": 502, "message": "Bad Gateway"}, "Error: Bad Gateway"),
        ({"type": "mcp_protocol_error", "code": -32602, "message": "Unknown tool"}, "Error: Unknown tool"),
        (
            {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "no such repo"}]},
            "Error: no such repo",
        ),
        (
            {"type": "mcp_tool_execution_error", "content": {"k": 1}},
            'Error: {"content":{"k":1},"type":"mcp_tool_execution_error"}',
        ),
        (None, NO_RESULT),
    ],
)
def test_error_text(error: Any, text: str) -> None:
    assert error_text(error) == text and text.startswith("Error: ")
