"""Scripts for the simulated engine: what a "model turn" is, and the default behaviour.

A script is any callable ``script(view: PromptView) -> Turn | None`` (``None`` = default). Tests
inject scripts to make the engine call a given tool, fail mid-stream, stall, or talk forever;
benchmarks use :func:`default_script`, which behaves like a terse gpt-oss agent: a short
reasoning message, then a call to the first offered tool when the user just spoke, otherwise a
final answer echoing the input.

:func:`turn_tokens` turns a :class:`Turn` into the *canonical* harmony completion (exactly what
:func:`inference.harmony_render.render_completion` gives), so the renderer's incremental
contract holds for simulated outputs.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from inference.harmony_core import harmony_encoding, recipient_for
from inference.harmony_render import render_completion
from inference.simulated_prompt import PromptView, ToolSpec
from inference.summary import SUMMARY_PREFIX, is_summary_request

__all__ = [
    "Script",
    "ToolCall",
    "Turn",
    "completion_tokens",
    "default_script",
    "summary_turn",
    "turn_tokens",
    "turns_in_order",
]

_FILLER = " lorem ipsum dolor sit amet"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the simulated model makes.

    ``arguments``: a ``str`` is sent verbatim, anything else is JSON-encoded (``None`` -> ``{}``).
    For ``custom=True`` (a freeform tool) ``arguments`` is the raw input text.
    """

    name: str
    arguments: Any = None
    namespace: str | None = None
    custom: bool = False

    def body(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        if self.arguments is None:
            return "" if self.custom else "{}"
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Turn:
    """One simulated generation.

    Messages are emitted in this order: ``reasoning`` (analysis), ``commentary`` (a preamble),
    each of ``tool_calls``, then ``text`` (final answer). With harmony's stop tokens in force
    (the default, like gpt-oss) generation ends at the first ``<|call|>``, so only the first
    call is ever sampled; pass ``eos_token_ids=()`` to the engine to sample them all. A turn with
    neither calls nor text answers with an empty final message, so every turn ends in a stop
    token.

    Test hooks: ``fail_after_tokens`` raises ``EngineError`` after that many tokens;
    ``delay_per_token_s`` overrides the engine's decode speed; ``endless`` replaces the final
    answer with filler that never ends (until ``max_tokens`` or cancellation).
    """

    reasoning: str | None = None
    commentary: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    fail_after_tokens: int | None = None
    delay_per_token_s: float | None = None
    endless: bool = False


Script = Callable[[PromptView], "Turn | None"]


def _messages(turn: Turn) -> list[Any]:
    from openai_harmony import Message, Role

    def assistant(text: str, channel: str) -> Any:
        return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)

    out = []
    if turn.reasoning is not None:
        out.append(assistant(turn.reasoning, "analysis"))
    if turn.commentary is not None:
        out.append(assistant(turn.commentary, "commentary"))
    for call in turn.tool_calls:
        msg = assistant(call.body(), "commentary").with_recipient(recipient_for(call.name, call.namespace))
        out.append(msg if call.custom else msg.with_content_type("<|constrain|>json"))
    if turn.endless or turn.text is not None or not turn.tool_calls:
        out.append(assistant("" if turn.endless else (turn.text or ""), "final"))
    return out


@functools.lru_cache(maxsize=1024)
def _completion(
    reasoning: str | None, commentary: str | None, tool_calls: tuple[ToolCall, ...], text: str | None, endless: bool
) -> tuple[int, ...]:
    """Rendered once per distinct turn: a script that answers alike every time (the benchmarks'
    zero-latency engine) should cost the engine emulation nothing per request. Keyed by the
    fields the rendering reads (not the :class:`Turn`, whose generated ``__hash__`` and ``__eq__``
    ran as Python on every lookup; the fields hash and compare in C), bounded like any cache."""
    return tuple(render_completion(_messages(Turn(reasoning, commentary, tool_calls, text, endless=endless))))


def completion_tokens(turn: Turn) -> Sequence[int]:
    """The canonical completion of ``turn`` as a sequence (with its final message's terminator
    even when ``turn.endless``: :func:`turn_tokens` drops that)."""
    try:
        return _completion(turn.reasoning, turn.commentary, turn.tool_calls, turn.text, turn.endless)
    except TypeError:  # unhashable: a tool call's arguments given as a dict
        return render_completion(_messages(turn))


def turn_tokens(turn: Turn) -> Iterator[int]:
    """The canonical completion of ``turn`` (infinite when ``turn.endless``)."""
    tokens = completion_tokens(turn)
    if not turn.endless:
        return iter(tokens)
    # drop the final message's terminator: the answer never ends
    return itertools.chain(tokens[:-1], itertools.cycle(_filler_tokens()))


@functools.lru_cache(maxsize=1)
def _filler_tokens() -> tuple[int, ...]:
    """An endless answer's repeating words, encoded once: harmony's ``encode`` builds its
    special-token regex on every call, which made the stand-in, not the gateway, half the CPU of a
    capped streaming turn in the benchmarks."""
    return tuple(harmony_encoding().encode(_FILLER))


def turns_in_order(turns: Iterable[Turn | None], then: Script | None = None) -> Script:
    """A script that plays ``turns`` one per request, then falls back to ``then`` (or default)."""
    pending = iter(list(turns))

    def script(view: PromptView) -> Turn | None:
        turn = next(pending, None)
        if turn is not None:
            return turn
        return then(view) if then is not None else None

    return script


def _snippet(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: the most characters of an input the default script echoes verbatim
ECHO_LIMIT = 2000


def _echo(text: str) -> str:
    """The input as the answer repeats it: verbatim up to :data:`ECHO_LIMIT` characters, then cut
    with a note of how much was left out.

    Why bounded: harmony's renderer (Rust, a backtracking regex) takes time quadratic in a run of
    one repeated character and overflows its stack near a megabyte (a 1 MB string of ``x`` panics
    the process's render), and an answer as long as the question is no plausible model turn. An
    engine stand-in must survive any input the gateway accepts, at a cost independent of it.
    """
    if len(text) <= ECHO_LIMIT:
        return text
    return f"{text[:ECHO_LIMIT]}… ({len(text) - ECHO_LIMIT} more characters)"


def _pick_tool(tools: Sequence[ToolSpec], forced: str | None) -> ToolSpec:
    if forced:
        for tool in tools:
            if tool.name == forced:
                return tool
    return next((t for t in tools if not t.freeform), tools[0])


def default_script(view: PromptView) -> Turn:
    """Reason briefly; call the first tool after a user message; otherwise answer from the input.

    Reads only ``view.last`` and (when there is a user message) ``view.tools``: O(newest message
    + prelude), whatever the history length. Echoes are bounded (:func:`_echo`).
    """
    last = view.last
    if last is None:
        return Turn(reasoning="There is no message to answer.", text="Hello!")
    if last.role == "user" and is_summary_request(last.text):
        return summary_turn(view)
    said = _snippet(last.text) or "(nothing)"
    if last.role == "user":
        tools, choice = view.tools, view.tool_choice
        if tools and choice != "none":
            tool = _pick_tool(tools, choice if choice != "required" else None)
            value = said if said != "(nothing)" else "example"
            call = (
                ToolCall(tool.name, value, tool.namespace, custom=True)
                if tool.freeform
                else ToolCall(tool.name, tool.example_arguments(value), tool.namespace)
            )
            return Turn(reasoning=f"The user asked: {said}. I will call {tool.name}.", tool_calls=(call,))
    if last.role == "tool":
        return Turn(
            reasoning=f"The tool {last.tool_name} returned a result. I will report it.",
            text=f"Tool {last.tool_name} returned: {_echo(last.text)}",
        )
    return Turn(
        reasoning=f"The {last.role} said: {said}. I will answer directly.", text=f"You said: {_echo(last.text)}"
    )


def summary_turn(view: PromptView) -> Turn:
    """A deterministic answer to the compaction request (:mod:`inference.summary`).

    Decodes the whole prompt (a summary is O(history) by nature) and names what it covered: how
    many messages, whether an earlier summary was among them, and short snippets (24 characters)
    of the last three user requests — so tests can tell a summary from the verbatim history.
    """
    msgs = view.messages()[:-1]  # without the request itself
    body = [m for m in msgs if m.role in ("user", "assistant", "tool")]
    earlier = any(m.role == "developer" and m.text.startswith(SUMMARY_PREFIX) for m in msgs)
    asks = [_snippet(m.text, 24) for m in body if m.role == "user"][-3:]
    text = f"Compacted {len(body)} messages" + (" and an earlier summary" if earlier else "") + "."
    if asks:
        text += " The user asked: " + " | ".join(asks) + "."
    return Turn(reasoning="I will summarize the conversation.", text=text)
