"""What a chat template does, found by probing it: the basis of per-message rendering.

:func:`probe_template` renders small conversations through the template once, at renderer
construction (a few milliseconds), and records:

* the generation prompt and how an assistant turn ends (end-of-turn token + post-message tokens:
  also how a turn cut off by the output cap is closed, ``ChatTemplateRenderer.cut_history``);
* capabilities: does the template render ``tools`` / ``tool_calls`` / ``tool`` messages (wrapped
  in ``<tool_response>``?) / a ``developer`` role / ``reasoning_content`` (and does it drop
  reasoning of earlier turns)?
* **joins**: ordered pairs of message kinds whose rendering is not the concatenation of their
  isolated renderings (``loop.last``, looking at the previous or next message...);
* **decomposable**: sample conversations render exactly as the concatenation of isolated runs,
  in text and in tokens. If not, the renderer still renders (per message) but reports every
  append as not exact.

A message is rendered *in isolation* as ``template(ANCHOR + [msg]) - template(ANCHOR)`` (the
anchor's text must be a prefix), so it sees the same context — a system message and a user
message before it — whatever the real history is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ANCHOR",
    "TemplateError",
    "TemplateProfile",
    "emulated_tools_block",
    "native_render",
    "probe_template",
]

#: the fixed context every message is rendered after
ANCHOR: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
)
_PROBE_FN = "zz_probe_fn"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_FN, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


class TemplateError(ValueError):
    """The chat template cannot be used for per-message rendering (or at all)."""


def native_render(
    tokenizer: Any,
    template: str,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    generation_prompt: bool = False,
) -> str:
    """The template's own rendering of ``messages`` (text)."""
    return tokenizer.apply_chat_template(
        list(messages),
        tools=tools,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def emulated_tools_block(schemas: list[dict[str, Any]]) -> str:
    """Qwen2.5's Hermes tool instructions, for templates that do not render ``tools`` themselves."""
    import json

    lines = "".join("\n" + json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        + lines
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(frozen=True, slots=True)
class TemplateProfile:
    anchor_text: str
    generation_prompt: str
    end_token: int
    post_tokens: tuple[int, ...]
    stop_token_ids: tuple[int, ...]
    native_tools: bool
    native_tool_calls: bool
    tool_role: str
    wraps_tool_response: bool
    knows_developer: bool
    reasoning: bool
    reasoning_dropped: bool
    #: text the template puts before the conversation when there is no system message
    default_system: str
    joins: frozenset[tuple[str, str]]
    decomposable: bool
    #: (user probe message, its isolated text): how the prelude's end is found
    probe_user: tuple[dict[str, Any], str]
    #: human-readable findings (what is not append-exact or not faithful, and why)
    notes: tuple[str, ...] = field(default=())

    def isolated(self, tokenizer: Any, template: str, messages: Sequence[dict[str, Any]]) -> str:
        """Text of ``messages`` rendered after :data:`ANCHOR`."""
        text = native_render(tokenizer, template, [*ANCHOR, *messages])
        if not text.startswith(self.anchor_text):
            raise TemplateError("the template re-renders earlier messages when one is added")
        return text[len(self.anchor_text) :]


def probe_template(tokenizer: Any, template: str, encode: Callable[[str], list[int]]) -> TemplateProfile:
    """Probe ``template`` (see the module docstring). Raises :class:`TemplateError` when the
    template has no usable assistant turn shape."""

    def render(msgs: Sequence[dict[str, Any]], tools: Any = None, gp: bool = False) -> str:
        return native_render(tokenizer, template, msgs, tools, gp)

    anchor_text = render(ANCHOR)

    def iso(msgs: Sequence[dict[str, Any]]) -> str:
        text = render([*ANCHOR, *msgs])
        if not text.startswith(anchor_text):
            raise TemplateError("the template re-renders earlier messages when one is added")
        return text[len(anchor_text) :]

    def safe_iso(msgs: Sequence[dict[str, Any]]) -> str:
        try:
            return iso(msgs)
        except Exception:  # a template may raise_exception() on what it does not support
            return ""

    notes: list[str] = []
    gp_full = render(ANCHOR, gp=True)
    if not gp_full.startswith(anchor_text) or gp_full == anchor_text:
        raise TemplateError("the template has no generation prompt")
    gp = gp_full[len(anchor_text) :]

    body = "Zq9 probe answer"
    turn = iso([{"role": "assistant", "content": body}])
    if not turn.startswith(gp) or turn.count(body) != 1:
        raise TemplateError("an assistant turn does not start with the generation prompt")
    post = turn[turn.index(body) + len(body) :]
    if turn[len(gp) : turn.index(body)]:
        raise TemplateError("the template puts text between the generation prompt and the answer")
    post_ids = encode(post)
    special = set(tokenizer.all_special_ids)
    if not post_ids or post_ids[0] not in special:
        raise TemplateError("an assistant turn does not end with a special end-of-turn token")
    end_token = post_ids[0]
    stops = [end_token]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stops:
        stops.append(int(tokenizer.eos_token_id))

    native_tools = _PROBE_FN in render([{"role": "user", "content": "U"}], tools=[_PROBE_TOOL])
    calls_msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": _PROBE_FN, "arguments": {"x": 1}}}],
    }
    native_tool_calls = _PROBE_FN in safe_iso([calls_msg])
    tool_text = safe_iso([{"role": "tool", "content": "Tq7 probe"}])
    tool_role = "tool" if "Tq7 probe" in tool_text else "user"
    wraps = tool_role == "tool" and "<tool_response>" in tool_text
    knows_developer = "developer" in template
    reasoning = "Rq3 probe" in safe_iso([{"role": "assistant", "content": "A", "reasoning_content": "Rq3 probe"}])
    reasoning_dropped = False
    if reasoning:
        conv = [
            {"role": "assistant", "content": "A1", "reasoning_content": "Rq1 probe"},
            {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "A2", "reasoning_content": "Rq2 probe"},
        ]
        reasoning_dropped = "Rq1 probe" not in safe_iso(conv)
        if reasoning_dropped:
            notes.append("template drops earlier reasoning; we keep it (history is never rewritten)")
    user_probe = {"role": "user", "content": "Uq5 probe"}
    user_text = iso([user_probe])
    first = render([user_probe])
    default_system = first[: len(first) - len(user_text)] if first.endswith(user_text) else ""
    if default_system:
        notes.append(
            "template injects a default system prompt when the first message is not system; "
            "a first system item then renders after it instead of replacing it"
        )

    kinds: dict[str, dict[str, Any]] = {
        "system": {"role": "system", "content": "Pq1 sys"},
        "user": {"role": "user", "content": "Pq2 user"},
        "assistant": {"role": "assistant", "content": "Pq3 asst"},
        "tool": {"role": tool_role, "content": "Pq4 tool" if wraps else "<tool_response>\nPq4 tool\n</tool_response>"},
    }
    if native_tool_calls:
        kinds["assistant_calls"] = calls_msg
    joins = set()
    for a, ma in kinds.items():
        for b, mb in kinds.items():
            try:
                if iso([ma, mb]) != iso([ma]) + iso([mb]):
                    joins.add((a, b))
            except TemplateError:
                joins.add((a, b))
    for a, b in sorted(joins):
        notes.append(f"({a}, {b}) render together: an append between them is not exact")

    decomposable = _verify(kinds, joins, iso, encode, notes)
    return TemplateProfile(
        anchor_text=anchor_text,
        generation_prompt=gp,
        end_token=end_token,
        post_tokens=tuple(post_ids[1:]),
        stop_token_ids=tuple(stops),
        native_tools=native_tools,
        native_tool_calls=native_tool_calls,
        tool_role=tool_role,
        wraps_tool_response=wraps,
        knows_developer=knows_developer,
        reasoning=reasoning,
        reasoning_dropped=reasoning_dropped,
        default_system=default_system,
        joins=frozenset(joins),
        decomposable=decomposable,
        probe_user=(user_probe, user_text),
        notes=tuple(notes),
    )


def _verify(
    kinds: dict[str, dict[str, Any]],
    joins: set[tuple[str, str]],
    iso: Callable[[Sequence[dict[str, Any]]], str],
    encode: Callable[[str], list[int]],
    notes: list[str],
) -> bool:
    """Sample conversations (every kind, several orders, repeats) render run by run, exactly."""
    names = list(kinds)
    orders = [names, names[::-1], names[1:] + names[:1], [n for n in names for _ in (0, 1)]]
    for order in orders:
        runs: list[list[str]] = []
        for k in order:
            if runs and (runs[-1][-1], k) in joins:
                runs[-1].append(k)
            else:
                runs.append([k])
        try:
            whole = iso([kinds[k] for k in order])
            parts = [iso([kinds[k] for k in run]) for run in runs]
        except TemplateError as e:
            notes.append(f"not decomposable: {e}")
            return False
        if whole != "".join(parts):
            notes.append(f"not decomposable: conversation {order} renders differently as a whole")
            return False
        if encode(whole) != [t for p in parts for t in encode(p)]:
            notes.append(f"not decomposable: conversation {order} tokenizes differently as a whole")
            return False
    return True
