"""The ``python`` tool every model family is offered when the gateway runs ``code_interpreter``.

gpt-oss was trained on a built-in ``python`` tool: its system message carries harmony's own text
(``SystemContent.with_python_tool``: a stateful notebook, ``/mnt/data`` for files), the model sends
its code as the *raw* content of a message to recipient ``python`` (no function, no JSON), and reads
the tool's answer from author ``python``. Other families get a function-shaped ``namespace`` tool
(:func:`python_namespace`: ``python`` with one function ``run(code)``, chat-template name
``python__run``), so one parser path (namespace ``python``) and one item type serve every family.
:func:`code_of` reads the code from either form.

The citation mark for a file the code wrote is ``sandbox:/mnt/data/<path>`` (what gpt-oss writes
for a file in its notebook's drive, and what the tool's answer lists): the namespace's description
teaches it to the other families (``gateway.tools.code_interpreter``).
"""

from __future__ import annotations

import functools
from typing import Any

import orjson

__all__ = ["PYTHON", "RUN", "SANDBOX_PREFIX", "code_of", "python_namespace"]

#: the tool's namespace, and harmony's recipient/author of gpt-oss's built-in python
PYTHON = "python"
#: the function of the namespace other families call (``python__run``)
RUN = "run"
#: how the model names a file of the container in its answer (``sandbox:/mnt/data/chart.png``)
SANDBOX_PREFIX = "sandbox:/mnt/data/"
#: the longest program the namespace's schema lets a constrained decoder write
MAX_CODE_CHARS = 64_000


@functools.cache
def python_namespace() -> dict[str, Any]:
    """The tool as families without a built-in python see it."""
    return {
        "type": "namespace",
        "name": PYTHON,
        "description": (
            "Runs Python code in a stateful sandbox (variables and files persist between calls; no "
            "network). The user's files and the files you write are in /mnt/data. You read back what "
            "the code printed and the files it wrote. To give the user a file you wrote, write its "
            "path in your answer as sandbox:/mnt/data/<name>, e.g. [chart](sandbox:/mnt/data/chart.png)."
        ),
        "tools": [
            {
                "type": "function",
                "name": RUN,
                "description": "Runs the code and returns its output (print what you want to see).",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "minLength": 1, "maxLength": MAX_CODE_CHARS}},
                    "required": ["code"],
                    "additionalProperties": False,
                },
                "strict": False,
            }
        ],
    }


def code_of(function: str, arguments: str) -> str | None:
    """The code of a call: harmony's built-in python (``function`` is ``python``) sends it raw; the
    namespace's ``run`` sends ``{"code": ...}``. None: arguments that hold no code."""
    if function == PYTHON:
        return arguments
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return None
    code = args.get("code") if isinstance(args, dict) else None
    return code if isinstance(code, str) else None
