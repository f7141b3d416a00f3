"""The harmony family for gpt-oss models: the public entry point.

Three concepts, three modules, re-exported here so callers import one name:

* :mod:`inference.harmony_core` — the process-wide ``o200k_harmony`` encoding (loaded lazily,
  once, from the offline vocab), its special tokens, and :class:`ToolCatalog`, the single mapping
  between Responses tool dicts and harmony tool namespaces that rendering and parsing share;
* :mod:`inference.harmony_render` — :class:`HarmonyRenderer`, items -> tokens, and the statement
  of the incremental contract (read its module docstring);
* :mod:`inference.harmony_parse` — :class:`HarmonyStreamParser`, sampled tokens -> item events.
"""

from inference.harmony_core import (
    FREEFORM_NOTE,
    FUNCTIONS,
    HarmonyTokens,
    ToolCatalog,
    harmony_encoding,
    harmony_tokens,
    recipient_for,
)
from inference.harmony_parse import HarmonyParseError, HarmonyStreamParser
from inference.harmony_render import HarmonyRenderer, UnknownCallError, render_completion

__all__ = [
    "FREEFORM_NOTE",
    "FUNCTIONS",
    "HarmonyParseError",
    "HarmonyRenderer",
    "HarmonyStreamParser",
    "HarmonyTokens",
    "ToolCatalog",
    "UnknownCallError",
    "harmony_encoding",
    "harmony_tokens",
    "recipient_for",
    "render_completion",
]
