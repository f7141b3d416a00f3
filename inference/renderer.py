"""Renderer protocol: Responses items -> token ids, with the incremental contract.

A conversation renders as ``prelude(settings) + items(it_1) + items(it_2) + ...`` and a prompt for
generation adds ``generation_prompt()``. The **incremental contract** every renderer states and
tests (property tests over random conversations) is:

    render_prelude(p) + render_items(a) + render_items(b) == render_prelude(p) + render_items(a + b)

and, for the model's own output, ``history_tokens(sampled)`` is what the model's turn looks like in
the history (token-exact with ``render_items(parsed output items)`` when the model sampled canonical
tokens; real models may not, which is why the pipeline keeps sampled tokens verbatim). A
generation cut off before its stop token stays in the history as ``cut_history(sampled)``: verbatim,
the cut message closed as the format closes one, so the next turn appends too (each renderer
states when that equals a full render of the cut items).

Anything that is rendered *before* the conversation (instructions, tools, reasoning effort...) is
the prelude. When a continuation turn has a different prelude than its parent
(``prelude_key`` differs) an append is not exact and the pipeline falls back to a full render,
counted in a metric.

Items are plain dicts in canonical Responses shape (validated by the gateway's wire types):
``message`` (role system|developer|user|assistant, content = list of parts with ``text``),
``function_call`` (call_id, name, arguments, namespace?), ``function_call_output`` (call_id, output
as str), ``custom_tool_call`` (call_id, name, input, namespace?), ``custom_tool_call_output``
(call_id, output), ``reasoning`` (content=[{type: reasoning_text, text}], summary=[...]).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import orjson

from cache.lru import BoundedLRU
from inference.parse import StreamParser


class Prelude(msgspec.Struct, frozen=True):
    """Request-level settings a renderer may place before the conversation."""

    instructions: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = "auto"
    reasoning_effort: str | None = None
    #: built-in tools the model is offered besides ``tools`` (``"browser"``: ``inference.browser_tool``),
    #: each renderer showing them its family's way
    builtin: tuple[str, ...] = ()


T = TypeVar("T")


class PerToolSet(Generic[T]):
    """``build(tools)`` kept for the tools tuple it was built from, found again by identity.

    Why: the gateway hands every turn that offers byte-identical tools the same tuple
    (``gateway.turn.checks.ToolChecks``), and a renderer builds a catalog of them for each turn's
    parser (~40 us for a coding agent's tools). Identity is exact and costs nothing: an equal tuple
    that is another object is built anew, never confused with this one; the memo holds the tuple it
    names, so an id is not reused while it is kept. The last ``size`` tool sets built are kept (a
    :class:`~cache.lru.BoundedLRU` bounded by entries, read with ``peek``: a hit is a dict lookup,
    no lock, as every turn asks), for tuples only (a list could change after it was built from)."""

    def __init__(self, build: Callable[[tuple[dict[str, Any], ...]], T], size: int = 64) -> None:
        self._build = build
        self._memo: BoundedLRU[int, tuple[tuple[dict[str, Any], ...], T]] = BoundedLRU(size)

    def __call__(self, tools: Sequence[dict[str, Any]]) -> T:
        if type(tools) is not tuple:
            return self._build(tuple(tools))
        hit = self._memo.peek(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1]
        value = self._build(tools)
        self._memo.put(id(tools), (tools, value))
        return value


def _digest_of_tools(tools: tuple[dict[str, Any], ...]) -> bytes:
    payload = orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(payload, digest_size=16).digest()


#: blake2b of a tool set's JSON (sorted keys), for the renderers' ``prelude_key``: a coding agent's
#: ~10 KB of tools serialized and hashed once per tool set instead of every turn
tools_digest: PerToolSet[bytes] = PerToolSet(_digest_of_tools)


class Constraint(dict):
    """A renderer's structured-output constraint: the mapping itself is vLLM
    ``StructuredOutputsParams`` fields (empty: nothing to enforce), ``fallbacks`` the syntaxes of
    custom-tool grammars it could not enforce (described in prose only; the gateway counts them)."""

    __slots__ = ("fallbacks",)

    def __init__(self, fields: Mapping[str, Any] | None = None, fallbacks: Sequence[str] = ()) -> None:
        super().__init__(fields or {})
        self.fallbacks: tuple[str, ...] = tuple(fallbacks)


class Renderer(Protocol):
    family: str
    #: tokens that end a generation (e.g. harmony <|return|>, <|call|>)
    stop_token_ids: tuple[int, ...]

    def prelude_key(self, prelude: Prelude) -> bytes:
        """Equal keys imply identical prelude tokens (cheap: hashes settings, not the history) and
        the same tools: their JSON is in the key verbatim (values and types; key order aside), as
        the gateway's caches of what it builds from the tools rely on (the echoed tools, the
        constraints: ``gateway.turn.pipeline``, ``gateway.turn.sampling``)."""

    def render_prelude(self, prelude: Prelude) -> list[int]: ...

    def render_items(
        self, items: Sequence[dict[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of ``items`` as they appear in the conversation (no generation prompt).

        ``calls`` maps call ids to the call items of the whole chain, so that a tool output in a
        continuation can be rendered with the tool name of a call made in an earlier turn.
        """

    def append_break(self, previous: Sequence[Mapping[str, Any]], new_items: Sequence[Mapping[str, Any]]) -> str | None:
        """Why appending ``new_items`` after a rendering of ``previous`` would not be token-exact
        (the pipeline then renders in full and counts the reason), or None. Must look at the
        boundary only (the last items of ``previous``), never scan the history."""

    def generation_prompt(self) -> list[int]:
        """Tokens that ask the model to produce the assistant turn (e.g. ``<|start|>assistant``)."""

    def history_tokens(self, sampled: Sequence[int]) -> list[int]:
        """The model's sampled tokens as they stay in the history (e.g. terminal stop normalized)."""

    def cut_history(self, sampled: Sequence[int]) -> list[int] | None:
        """A generation that ended without its stop token (``max_output_tokens``, the context
        limit) as it stays in the history so that the next turn can append: the sampled tokens
        verbatim, then the tokens that close the cut message the way the format closes a message.
        Only a trailing message *header* that carries no content yet may be dropped; None when
        that header is the generation prompt's own (the history then ends before the generation
        prompt). Equals :meth:`history_tokens` when ``sampled`` ends with a stop token."""

    def count_text_tokens(self, text: str) -> int: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (logprobs report them); a special token's own name."""

    def constraint(self, prelude: Prelude, text_format: Mapping[str, Any] | None) -> Constraint | dict[str, Any] | None:
        """Structured-output constraint for the engine (vLLM ``StructuredOutputsParams`` fields), or
        None. Only the renderer knows its tool-call syntax, so it turns ``tool_choice`` (required or a
        named tool), ``text.format`` (json_schema / json_object) and ``custom`` tools' grammars
        (``inference.tool_grammar``; under ``auto`` they apply once the model calls that tool) into a
        grammar or schema. A grammar the engine could not enforce is left out and reported in
        :attr:`Constraint.fallbacks` — the turn runs with the grammar in prose only."""

    def parser(self, prelude: Prelude) -> StreamParser:
        """A fresh streaming parser for one generation under ``prelude`` (knows the tool names)."""
