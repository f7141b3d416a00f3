"""Harmony renderer (gpt-oss): Responses items -> ``o200k_harmony`` token ids, incrementally.

Why per message: every harmony message is delimited by special tokens (``<|start|>`` …
``<|end|>``/``<|call|>``), and BPE never merges across a special token, so the tokens of a
conversation are exactly the concatenation of its messages' tokens. We therefore render **one
message at a time** with ``enc.render(message)``: a continuation turn costs O(new items), never a
re-render of the history. Message text is tokenized by tiktoken and spliced into harmony's header
(:mod:`inference.harmony_content`): the same tokens as ``enc.render``, ~3x faster on large tool
outputs.

The incremental contract (checked by property tests in ``tests/inference/test_harmony_render.py``)
---------------------------------------------------------------------------------------------
Let ``R = HarmonyRenderer()``, ``p`` a :class:`~inference.renderer.Prelude`, and ``a``, ``b`` lists of
canonical items in which every ``*_call_output`` can find its call (see *calls* below).

(a) **Append is exact.** ``R.render_prelude(p) + R.render_items(a) + R.render_items(b, calls=C)
    == R.render_prelude(p) + R.render_items(a + b)`` for every split, where ``C`` indexes the
    calls made in ``a`` (the gateway passes the chain's call index; for remote MCP items it
    holds each approval request as :func:`inference.hosted_items.call_of` gives it).
    ``render_prelude`` depends only on ``p``, ``render_items`` only on the items (and ``calls``
    for names). Property tests with MCP items: ``tests/inference/test_hosted_items.py``.

(b) **It is harmony's rendering.** ``R.render_prelude(p) + R.render_items(a)`` equals
    ``enc.render_conversation(Conversation(R.prelude_messages(p) + R.item_messages(a)),
    RenderConversationConfig(auto_drop_analysis=False))``.

(c) **The model's turn round-trips.** If the engine sampled the *canonical* completion ``S`` of
    output items ``O`` — :func:`render_completion` of their messages: the rendered messages
    without the leading ``<|start|>assistant`` (that is the generation prompt) and with a final
    answer's trailing ``<|end|>`` sampled as ``<|return|>`` — then
    ``R.generation_prompt() + R.history_tokens(S) == R.render_items(O)`` where ``O`` are the
    items :class:`~inference.harmony_parse.HarmonyStreamParser` parses from ``S``.

Where it does **not** hold (by design or by nature):

* harmony's *default* conversation renderer (``auto_drop_analysis=True``) drops the analysis
  messages of earlier turns. We never drop anything: the history is what the engine's KV cache
  holds, and dropping would rewrite earlier tokens and forfeit the prefix cache. A full render by
  this renderer (the pipeline's fallback) keeps analysis too, so both paths agree with each other
  — just not with harmony's default.
* A real model may sample non-canonical tokens: the recipient in the role header
  (``<|start|>assistant to=functions.f<|channel|>commentary``), ``json`` without
  ``<|constrain|>``, a different BPE split of the same text. Then (c) fails; this is why the
  pipeline keeps sampled tokens verbatim (``history_tokens``) instead of re-rendering parsed items.
* A generation cut off mid-message (``finish_reason="length"``) has no terminator. It is not
  re-rendered: :meth:`HarmonyRenderer.cut_history` closes it (*Cut-off generations* below) and
  the next turn appends.
* A changed prelude (different ``prelude_key``): appending is not exact; the pipeline re-renders.
* Messages with several text parts render harmony's way (parts back to back, each tokenized on
  its own); parsing returns one part, so such items do not round-trip item-for-item.

Cut-off generations
-------------------
(d) **A cut generation closes where harmony closes a message.** For sampled tokens ``s`` that end
    without a stop token, ``R.cut_history(s)`` is ``s`` verbatim + ``<|end|>`` when the cut is in
    a message's content — ``<|call|>`` when its header names a recipient, as :meth:`render_items`
    ends a tool call — ``s`` itself when the cut follows a terminator, ``s`` less a header the
    model opened but did not finish (no content, no item), and None when the cut is inside the
    generation prompt's own header. Let ``O'`` be the items the parser makes of ``s`` (the cut one
    ``incomplete``). Then ``R.generation_prompt() + R.cut_history(s) == R.render_items(O')`` (an
    empty history when None) **exactly when** the cut is not in content, or the content tokens
    the cut left are tiktoken's own tokens of their text; otherwise they differ only inside the
    cut message, because a full render re-tokenizes its decoded text (a multi-byte character split
    by the cut is dropped, a cut word may split differently). The history keeps the sampled
    tokens: they are what the engine's KV cache holds, and the model next sees what it wrote.
    Analysis is kept either way (never dropped, as above). Property tests:
    ``tests/gateway/turn/test_render_cutoff.py``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
from openai_harmony import Role

from inference.browser_tool import BROWSER
from inference.content_text import content_texts
from inference.harmony_constraint import harmony_constraint
from inference.harmony_content import Header, MessageTokenizer, message_of
from inference.harmony_core import (
    ToolCatalog,
    content_encoding,
    encode_text,
    harmony_encoding,
    harmony_tokens,
    recipient_for,
)
from inference.harmony_parse import HarmonyStreamParser, vocab_bytes
from inference.harmony_prelude import needs_probe, render_developer
from inference.hosted_items import tool_view
from inference.item_types import CALL_PAYLOAD, CALL_TYPES, OUTPUT_TYPES, ItemType
from inference.prelude_cache import PreludeCache
from inference.python_tool import PYTHON
from inference.renderer import PerToolSet, Prelude, tools_digest
from inference.tool_prose import TOOL_CHOICE_NAMED, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED, tool_choice_line

__all__ = [
    "TOOL_CHOICE_NAMED",
    "TOOL_CHOICE_NONE",
    "TOOL_CHOICE_REQUIRED",
    "HarmonyRenderer",
    "UnknownCallError",
    "render_completion",
]

log = logging.getLogger(__name__)

_KEY_VERSION = b"harmony-v2"
#: a recipient in a message header (in the role part or after the channel, as the parser reads it)
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
_EFFORTS = {"none": "Low", "minimal": "Low", "low": "Low", "medium": "Medium", "high": "High", "xhigh": "High"}
#: tool_choice lines in the developer message (the simulated engine recognises them)


class UnknownCallError(ValueError):
    """A tool output refers to a ``call_id`` whose call is in neither the items nor ``calls``."""

    def __init__(self, call_id: str) -> None:
        super().__init__(f"no tool call found for call output with call_id {call_id!r}")
        self.call_id = call_id


def render_completion(messages: Sequence[Any]) -> list[int]:
    """The canonical tokens a model samples for these assistant messages (contract (c)).

    That is each message rendered by harmony, minus the generation prompt
    ``<|start|>assistant`` of the first, with a final answer ending in ``<|return|>`` (harmony
    renders it as ``<|end|>`` in history). The simulated engine emits exactly this.
    """
    enc, tok = harmony_encoding(), harmony_tokens()
    out: list[int] = []
    for msg in messages:
        out += enc.render(msg)
    if out[:2] != [tok.start, tok.assistant]:
        raise ValueError("a completion starts with an assistant message")
    del out[:2]
    if out and out[-1] == tok.end and messages[-1].channel == "final":
        out[-1] = tok.return_
    return out


class HarmonyRenderer:
    """:class:`inference.renderer.Renderer` for gpt-oss models (harmony over ``o200k_harmony``)."""

    family = "harmony"

    def __init__(self) -> None:
        self._enc = harmony_encoding()
        self._tok = harmony_tokens()
        #: renders item messages: harmony's header + tiktoken's text tokens (equal to enc.render)
        self._messages = MessageTokenizer()
        self.stop_token_ids: tuple[int, ...] = tuple(self._enc.stop_tokens_for_assistant_actions())
        self._preludes = PreludeCache()
        #: each turn's parser reads the tools' catalog: built once per tool set
        self._catalogs = PerToolSet(ToolCatalog)
        vocab_bytes()  # the parser's vocabulary (~1 s to load): now, not in the first turn

    # -- prelude -------------------------------------------------------------------------------

    def prelude_key(self, prelude: Prelude) -> bytes:
        """blake2b of every prelude field (tools verbatim, through their own digest, so equal keys
        imply equal tokens)."""
        payload = orjson.dumps(
            [prelude.instructions, prelude.tool_choice, prelude.reasoning_effort, *prelude.builtin],
            option=orjson.OPT_SORT_KEYS,
            default=str,
        )
        return hashlib.blake2b(_KEY_VERSION + payload + tools_digest(prelude.tools), digest_size=16).digest()

    def prelude_messages(self, prelude: Prelude) -> list[Any]:
        """System message (no date: rendering must be deterministic) + developer message.

        The developer message carries ``instructions``, a ``tool_choice`` line and the tools, and
        is omitted when there is nothing to put in it.
        """
        from openai_harmony import DeveloperContent, Message, ReasoningEffort, Role, SystemContent

        effort = _EFFORTS.get(str(prelude.reasoning_effort or "medium").lower(), "Medium")
        system = SystemContent.new().with_reasoning_effort(ReasoningEffort(effort))
        if BROWSER in prelude.builtin:  # gpt-oss's own browser, as it was trained on it (``web_search``)
            system = system.with_browser_tool()
        if PYTHON in prelude.builtin:  # gpt-oss's own python, as it was trained on it (``code_interpreter``)
            system = system.with_python_tool()
        messages = [Message.from_role_and_content(Role.SYSTEM, system)]
        catalog = ToolCatalog(prelude.tools)
        lines = [prelude.instructions] if prelude.instructions else []
        choice = tool_choice_line(prelude.tool_choice) if catalog else None
        if choice:
            lines.append(choice)
        if lines or catalog:
            dev = DeveloperContent.new()
            if lines:
                dev = dev.with_instructions("\n\n".join(lines))
            for ns in catalog.namespace_configs():
                dev = dev.with_tools(ns)
            messages.append(Message.from_role_and_content(Role.DEVELOPER, dev))
        return messages

    def render_prelude(self, prelude: Prelude) -> list[int]:
        return self._preludes.tokens(self.prelude_key(prelude), lambda: self._render_prelude(prelude))

    def _render_prelude(self, prelude: Prelude) -> list[int]:
        from openai_harmony import RenderOptions

        messages = self.prelude_messages(prelude)
        # harmony's conversation renderer tells the system message that function tools exist
        # ("Calls to these tools must go to the commentary channel: 'functions'.")
        opts = RenderOptions(conversation_has_function_tools=ToolCatalog(prelude.tools).has_functions)
        tokens = self._enc.render(messages[0], opts)
        if len(messages) > 1:
            tokens += self._developer_tokens(prelude, messages[1])
        return tokens

    def _developer_tokens(self, prelude: Prelude, message: Any) -> list[int]:
        """The developer message's tokens; client text with long runs goes through
        :mod:`inference.harmony_prelude` (harmony's tokenizer is quadratic in a run's length)."""
        if needs_probe(prelude.instructions, prelude.tools):

            def build(instructions: str | None, tools: Any) -> Any:
                probe = Prelude(
                    instructions=instructions,
                    tools=tools,
                    tool_choice=prelude.tool_choice,
                    reasoning_effort=prelude.reasoning_effort,
                    builtin=prelude.builtin,
                )
                return self.prelude_messages(probe)[1]

            fast = render_developer(
                prelude.instructions, prelude.tools, build, self._enc, content_encoding(), harmony_tokens().message
            )
            if fast is not None:
                return fast
            log.warning("prelude probe check failed; rendering the developer message with harmony")
        return self._enc.render(message)

    # -- items ---------------------------------------------------------------------------------

    def item_messages(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[Any]:
        """The harmony messages of ``items`` (unknown item types contribute none)."""
        return [message_of(header, texts) for header, texts in self._item_specs(items, calls)]

    def _item_specs(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None
    ) -> Iterator[tuple[Header, list[str]]]:
        """Each item's message as its header and text parts, in order; an output's call is found
        among the earlier items first, then in ``calls``. Remote MCP items render as the calls and
        outputs they stand for (:func:`inference.hosted_items.tool_view`)."""
        local: dict[str, Mapping[str, Any]] = {}
        for item in tool_view(items):
            kind = item.get("type", "message")
            if kind in CALL_TYPES:
                local[str(item.get("call_id"))] = item
            spec = self._item_header(item, kind, local, calls)
            if spec is not None:
                yield spec

    @staticmethod
    def _call_name(
        item: Mapping[str, Any],
        local: Mapping[str, Mapping[str, Any]],
        calls: Mapping[str, Mapping[str, Any]] | None,
    ) -> tuple[str, str | None]:
        if item.get("name"):
            return str(item["name"]), item.get("namespace")
        call_id = str(item.get("call_id"))
        call = local.get(call_id) or (calls.get(call_id) if calls is not None else None)
        if call is None:
            raise UnknownCallError(call_id)
        return str(call["name"]), call.get("namespace")

    def _item_header(
        self,
        item: Mapping[str, Any],
        kind: str,
        local: Mapping[str, Mapping[str, Any]],
        calls: Mapping[str, Mapping[str, Any]] | None,
    ) -> tuple[Header, list[str]] | None:
        """The header and text parts of ``item``'s message (None: it makes none, e.g. a reasoning
        item with encrypted content only: nothing the model can read)."""
        if kind == "message":
            role = Role(item.get("role", "user")).value  # an unknown role: ValueError (a 400: gateway.turn.render)
            channel = ("commentary" if item.get("phase") == "commentary" else "final") if role == "assistant" else None
            return (role, None, channel, None, None), content_texts(item.get("content"))
        if kind == "reasoning":
            texts = content_texts(item.get("content")) or content_texts(item.get("summary"))
            return (("assistant", None, "analysis", None, None), texts) if texts else None
        if kind in CALL_TYPES:
            body = item.get(CALL_PAYLOAD[kind])
            ctype = "<|constrain|>json" if kind == ItemType.FUNCTION_CALL else None
            recipient = recipient_for(str(item["name"]), item.get("namespace"))
            return ("assistant", None, "commentary", recipient, ctype), [str(body or "")]
        if kind in OUTPUT_TYPES:
            name, namespace = self._call_name(item, local, calls)
            output = item.get("output")
            text = output if isinstance(output, str) else "".join(content_texts(output))
            return ("tool", recipient_for(name, namespace), "commentary", "assistant", None), [text]
        return None

    def render_items(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of ``items`` only (no generation prompt), one message at a time.

        ``calls`` maps ``call_id`` -> the ``function_call``/``custom_tool_call`` item, for tool
        outputs whose call was made in an earlier turn (the gateway passes the chain's index).
        Raises :class:`UnknownCallError` when an output's call cannot be found.

        Each item goes straight from its header and texts to tokens (``MessageTokenizer.render_header``);
        one that cannot (text harmony must judge: lone surrogates) is built as a message and rendered by
        harmony. Equal to rendering :meth:`item_messages` (property tests).
        """
        out: list[int] = []
        messages = self._messages
        for header, texts in self._item_specs(items, calls):
            ids = messages.render_header(header, texts)
            out += ids if ids is not None else messages.render(message_of(header, texts))
        return out

    # -- generation ----------------------------------------------------------------------------

    def generation_prompt(self) -> list[int]:
        return [self._tok.start, self._tok.assistant]

    def history_tokens(self, sampled: Sequence[int]) -> list[int]:
        """Sampled tokens as they stay in history: a trailing ``<|return|>`` becomes ``<|end|>``
        (harmony's convention for past answers); ``<|call|>`` and everything else stay verbatim,
        because they are what the engine's KV cache holds."""
        out = list(sampled)
        if out and out[-1] == self._tok.return_:
            out[-1] = self._tok.end
        return out

    def cut_history(self, sampled: Sequence[int]) -> list[int] | None:
        """A generation cut off before its stop token, closed as harmony closes a message
        (contract (d) in the module docstring): O(tokens of the last message), scanned in C.

        * cut inside content (the last structural token is ``<|message|>``): the sampled tokens
          verbatim + ``<|call|>`` when the header names a recipient (a tool call, as
          :meth:`render_items` ends one), else ``<|end|>``;
        * cut right after a terminator: the sampled tokens as :meth:`history_tokens` keeps them;
        * cut inside a header the model opened (``<|start|>`` after the last terminator): the
          header is dropped — no content was written, the parser made no item of it;
        * cut inside the generation prompt's own header (no ``<|message|>`` sampled yet): None.
        """
        tok = self._tok
        if sampled and sampled[-1] in self.stop_token_ids:
            return self.history_tokens(sampled)
        rev = list(sampled)
        rev.reverse()
        last, kind = len(rev), None
        for t in (tok.message, tok.start, tok.end, tok.call, tok.return_):
            try:
                i = rev.index(t, 0, last)
            except ValueError:
                continue
            last, kind = i, t
        if kind is None:
            return None  # still in the header the generation prompt opened: nothing was said
        at = len(sampled) - 1 - last
        if kind == tok.start:
            return list(sampled[:at])
        if kind != tok.message:
            return self.history_tokens(sampled[: at + 1])  # a terminator: what follows opens nothing
        try:  # the header runs from the <|start|> before it, or from the generation prompt's
            header = len(sampled) - rev.index(tok.start, last)
        except ValueError:
            header = 0
        closing = tok.call if self._header_recipient(sampled[header:at]) else tok.end
        return [*sampled, closing]

    @staticmethod
    def _header_recipient(header: Sequence[int]) -> bool:
        """Whether a message header names a recipient other than ``assistant`` (a tool call)."""
        vocab = vocab_bytes()
        text = b"".join(
            vocab.specials[t].encode() if t in vocab.specials else vocab.token_bytes(t) for t in header
        ).decode("utf-8", "replace")
        m = _RECIPIENT.search(text)
        return m is not None and m.group(1) != "assistant"

    def token_bytes(self, token_id: int) -> bytes:
        vocab = vocab_bytes()
        special = vocab.specials.get(token_id)
        return special.encode() if special is not None else vocab.token_bytes(token_id)

    def count_text_tokens(self, text: str) -> int:
        # tiktoken's ordinary tokens are harmony's (and tiktoken is linear in a run's length)
        return len(encode_text(text))

    def append_break(self, previous: Sequence[Mapping[str, Any]], new_items: Sequence[Mapping[str, Any]]) -> str | None:
        """Never: every harmony message renders on its own (contract (a) above)."""
        return None

    def constraint(self, prelude: Prelude, text_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A structural tag over harmony's token ids (see ``inference.harmony_constraint``): forced
        tool calls with schema-valid arguments, or a ``final`` answer that is schema-valid JSON."""
        return harmony_constraint(prelude.tools, prelude.tool_choice, text_format)

    def parser(self, prelude: Prelude) -> HarmonyStreamParser:
        return HarmonyStreamParser(self._catalogs(prelude.tools))
