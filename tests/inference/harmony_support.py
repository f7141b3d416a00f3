"""Shared test support for the harmony family: sample tools, hypothesis strategies, feeding a
parser and folding its events.

A plain module (not conftest) because hypothesis strategies are needed at decoration time.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from inference.parse import ItemDelta, ItemEnd, ItemStart, ParseEvent
from inference.renderer import Prelude

GET_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "detailed": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "note": {"type": "string"}},
                "required": ["lat"],
            },
        },
        "required": ["city", "unit", "days", "detailed", "tags", "where"],
    },
    "strict": True,
}
NO_PARAMS = {"type": "function", "name": "ping", "description": "Ping.", "parameters": None, "strict": False}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch to files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF body\nLF: "\\n"'},
}
MCP = {
    "type": "namespace",
    "name": "mcp_fs",
    "description": "A filesystem MCP server.",
    "tools": [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
        {"type": "custom", "name": "write_raw", "description": "Write raw text.", "format": {"type": "text"}},
    ],
}
WEB_SEARCH = {"type": "web_search"}
ALL_TOOLS = (GET_WEATHER, NO_PARAMS, APPLY_PATCH, MCP, WEB_SEARCH)

# text that stresses tokenization: unicode, whitespace, and special-token look-alikes
SPECIAL_LOOKALIKES = ["<|end|>", "<|start|>assistant", "<|call|><|return|>", "<|channel|>final<|message|>"]
TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(["", " ", "\n\n", "héllo 世界 🎉🎉", '{"a": [1, 2]}', *SPECIAL_LOOKALIKES]),
)
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
JSON_ARGS = st.dictionaries(
    st.text(max_size=6), st.one_of(st.none(), st.booleans(), st.integers(), TEXT), max_size=3
).map(lambda d: json.dumps(d, ensure_ascii=False))

PRELUDES = st.builds(
    Prelude,
    instructions=st.one_of(st.none(), TEXT),
    tools=st.lists(st.sampled_from(ALL_TOOLS), max_size=5, unique_by=id).map(tuple),
    tool_choice=st.sampled_from(["auto", "required", "none", {"type": "function", "name": "get_weather"}]),
    reasoning_effort=st.sampled_from([None, "minimal", "low", "medium", "high"]),
)


def content_parts(roles_output: bool, text: st.SearchStrategy[str] = TEXT) -> st.SearchStrategy[list[dict]]:
    """Message content parts (text, an image, a refusal) with text drawn from ``text``."""
    kind = "output_text" if roles_output else "input_text"
    part = st.one_of(
        text.map(lambda t: {"type": kind, "text": t}),
        st.just({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}),
        TEXT.map(lambda t: {"type": "refusal", "refusal": t}),
    )
    return st.lists(part, min_size=1, max_size=3)


@st.composite
def _message(draw: st.DrawFn) -> list[dict]:
    role = draw(st.sampled_from(["user", "user", "developer", "system", "assistant"]))
    item: dict[str, Any] = {"type": "message", "role": role, "content": draw(content_parts(role == "assistant"))}
    if role == "assistant" and draw(st.booleans()):
        item["phase"] = draw(st.sampled_from(["commentary", "final_answer"]))
    return [item]


@st.composite
def _reasoning(draw: st.DrawFn) -> list[dict]:
    text = draw(TEXT)
    if draw(st.booleans()):
        return [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}], "summary": []}]
    return [{"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}]


@st.composite
def _call_pair(draw: st.DrawFn) -> list[dict]:
    kind = draw(st.sampled_from(["function", "namespace", "custom"]))
    name = draw(st.one_of(st.sampled_from(["get_weather", "read_file", "apply_patch"]), NAME))
    if kind == "custom":
        call = {"type": "custom_tool_call", "name": name, "input": draw(TEXT)}
        out = {"type": "custom_tool_call_output", "output": draw(TEXT)}
    else:
        call = {"type": "function_call", "name": name, "arguments": draw(JSON_ARGS)}
        if kind == "namespace":
            call["namespace"] = "mcp_fs"
        out = {"type": "function_call_output", "output": draw(TEXT)}
    return [call, out] if draw(st.integers(0, 4)) else [call]


def _number_calls(blocks: list[list[dict]]) -> list[dict]:
    items: list[dict] = []
    n = 0
    for block in blocks:
        if block[0]["type"] in ("function_call", "custom_tool_call"):
            n += 1
            block = [dict(it, call_id=f"call_{n}") for it in block]
        items.extend(block)
    return items


CONVERSATIONS = st.lists(st.one_of(_message(), _reasoning(), _call_pair()), min_size=0, max_size=12).map(_number_calls)


@st.composite
def model_outputs(draw: st.DrawFn) -> list[dict]:
    """Canonical output items of one gpt-oss generation (what the parser must reproduce)."""
    items: list[dict] = []
    if draw(st.booleans()):
        items.append({"type": "reasoning", "content": [{"type": "reasoning_text", "text": draw(TEXT)}]})
    if draw(st.integers(0, 3)) == 0:
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "phase": "commentary",
                "content": [{"type": "output_text", "text": draw(TEXT)}],
            }
        )
    end = draw(st.sampled_from(["final", "function", "namespace", "custom", "custom_ns"]))
    if end == "final":
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": draw(TEXT)}]})
    elif end == "function":
        items.append({"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": draw(JSON_ARGS)})
    elif end == "namespace":
        items.append(
            {
                "type": "function_call",
                "call_id": "c",
                "name": "read_file",
                "namespace": "mcp_fs",
                "arguments": draw(JSON_ARGS),
            }
        )
    elif end == "custom":
        items.append({"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": draw(TEXT)})
    else:
        items.append(
            {
                "type": "custom_tool_call",
                "call_id": "c",
                "name": "write_raw",
                "namespace": "mcp_fs",
                "input": draw(TEXT),
            }
        )
    return items


def call_index(items: Iterable[dict]) -> dict[str, dict]:
    return {it["call_id"]: it for it in items if it["type"] in ("function_call", "custom_tool_call")}


def feed_all(parser: Any, tokens: list[int], sizes: list[int] | None = None) -> list:
    """A stream parser's events for ``tokens`` fed in chunks of ``sizes`` (cycled; default one
    token at a time), then its ``finish``: any renderer family's parser."""
    events, i, k = [], 0, 0
    while i < len(tokens):
        n = sizes[k % len(sizes)] if sizes else 1
        events += parser.feed(tokens[i : i + n])
        i, k = i + n, k + 1
    return events + parser.finish()


def random_sizes(seed: int, n: int) -> list[int]:
    """Chunk sizes of 1 to 7 tokens, as a network delivers a sample (``n`` of them cover n tokens)."""
    rng = random.Random(seed)
    return [rng.randint(1, 7) for _ in range(n)]


def items_from_events(events: Iterable[ParseEvent]) -> list[dict]:
    """Fold parser events into canonical output items (what the gateway's event builder does)."""
    items: list[dict] = []
    open_: dict | None = None
    text = ""
    for ev in events:
        if isinstance(ev, ItemStart):
            assert open_ is None, "ItemStart while an item is open"
            open_, text = {"start": ev}, ""
        elif isinstance(ev, ItemDelta):
            assert open_ is not None, "ItemDelta outside an item"
            text += ev.text
        elif isinstance(ev, ItemEnd):
            assert open_ is not None, "ItemEnd outside an item"
            start: ItemStart = open_["start"]
            items.append(_item(start, text, ev.complete))
            open_ = None
    assert open_ is None, "an item was left open"
    return items


def _item(start: ItemStart, text: str, complete: bool) -> dict:
    if start.kind == "reasoning":
        item: dict = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}]}
    elif start.kind == "message":
        item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        if start.phase == "commentary":
            item["phase"] = "commentary"
    elif start.kind == "function_call":
        item = {"type": "function_call", "call_id": "c", "name": start.name, "arguments": text}
    else:
        item = {"type": "custom_tool_call", "call_id": "c", "name": start.name, "input": text}
    if start.kind in ("function_call", "custom_tool_call") and start.namespace:
        item["namespace"] = start.namespace
    if not complete:
        item["incomplete"] = True
    return item
