"""Cheaper forms of per-turn checks answer exactly as the plain ones: the prefix digests' canonical
item (gateway/turn/prefix.py), the depth check of a frame whose tools are known
(gateway/wire/validation.py), and the classifiers' texts (gateway/turn/classify.py)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.turn.classify import texts_of
from gateway.turn.prefix import VOLATILE, canonical_bytes
from gateway.wire.validation import InputRejected, check_counts, check_depth, decode_json

_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4)),
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=3), kids, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    item=st.dictionaries(
        st.one_of(st.sampled_from(["id", "status", "type", "content", "x"]), st.text(max_size=3)), _values, max_size=6
    )
)
def test_canonical_bytes_is_the_sorted_item_without_volatile_keys_and_nulls(item: dict[str, Any]) -> None:
    want = orjson.dumps(
        {k: v for k, v in item.items() if k not in VOLATILE and v is not None}, option=orjson.OPT_SORT_KEYS
    )
    assert canonical_bytes(item) == want
    assert VOLATILE == {"id", "status"}  # the keys canonical_bytes drops


def _nested(depth: int) -> Any:
    node: Any = "x"
    for _ in range(depth):
        node = {"a": node}
    return node


def _known(tools: Any) -> bool:
    return isinstance(tools, list) and len(tools) > 0


TOOLS = [
    {
        "type": "function",
        "name": f"f{i}",
        "description": "[{" * 30,
        "parameters": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "string"}}}},
    }
    for i in range(30)
]


@pytest.mark.parametrize("depth", [3, 10, 62, 63, 64, 80])
@pytest.mark.parametrize("where", ["input", "text", "metadata_and_input"])
def test_known_tools_leave_the_rest_checked_as_before(depth: int, where: str) -> None:
    body: dict[str, Any] = {"model": "m", "tools": TOOLS}
    if where == "metadata_and_input":
        body["client_metadata"] = _nested(depth)
        body["input"] = [_nested(depth)]
    else:
        body[where] = _nested(depth)
    for raw in (json.dumps(body), json.dumps(body, indent=2).encode()):
        try:  # the plain check of the body without its tools
            check_depth({k: v for k, v in body.items() if k != "tools"}, 64)
            want = None
        except InputRejected as exc:
            want = (exc.param, exc.message)
        try:
            decode_json(raw, 64, _known)
            got = None
        except InputRejected as exc:
            got = (exc.param, exc.message)
        assert got == want


def test_unknown_tools_are_still_walked() -> None:
    deep_tools = [{"type": "function", "name": "f", "parameters": _nested(70)}]
    with pytest.raises(InputRejected) as err:
        decode_json(json.dumps({"model": "m", "tools": deep_tools}), 64, lambda tools: False)
    assert err.value.param == "tools"


def test_known_tools_skip_the_schema_sizes_only() -> None:
    body = {
        "model": "m",
        "tools": [{"type": "function", "name": "f", "parameters": {"d": "x" * 500}}],
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"d": "y" * 500}}},
    }
    with pytest.raises(InputRejected) as err:
        check_counts(body, max_items=10, max_tools=10, max_schema_bytes=100, known_tools=_known)
    assert err.value.param == "text.format.schema"
    with pytest.raises(InputRejected) as err:
        check_counts(body, max_items=10, max_tools=10, max_schema_bytes=100, known_tools=lambda tools: False)
    assert err.value.param == "tools[0].parameters"


def test_texts_of_joins_every_text_of_an_item() -> None:
    items = [
        {"type": "message", "role": "user", "content": "plain"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "a"},
                {"type": "input_image"},
                {"type": "input_text", "text": "b"},
            ],
        },
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "content": [{"type": "reasoning_text", "text": "r"}],
        },
        {"type": "reasoning", "content": "c", "summary": "t"},
        {"role": "user", "content": "no type", "id": 5},
    ]
    got = [(t.index, t.item_id, t.type, t.role, t.text) for t in texts_of(items)]
    assert got == [
        (0, None, "message", "user", "plain"),
        (1, None, "message", "user", "a\nb"),
        (2, None, "reasoning", None, "r\ns"),
        (3, None, "reasoning", None, "c\nt"),
        (4, None, "message", "user", "no type"),
    ]
