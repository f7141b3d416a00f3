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


@functools.cache
def browser_namespace() -> dict[str, Any]:
    """The browser as a ``namespace`` of (non-strict) functions, from harmony's own definition."""
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
                "parameters": t.parameters or {"type": "object", "properties": {}},
                "strict": False,
            }
            for t in config.tools
        ],
    }
