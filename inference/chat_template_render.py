"""Chat-template renderer: Responses items -> token ids through the model's own Jinja template.

For models whose prompt format is their Hugging Face chat template (ChatML models such as
SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct: ``<|im_start|>role\\n...<|im_end|>\\n``,
Hermes ``<tool_call>`` tools). The template and tokenizer are loaded once from the model folder.

Why and how per message
-----------------------
A chat template renders a *whole* conversation; re-rendering the history every turn is the
O(history) cost this gateway exists to avoid. So a message's text is rendered **in isolation**:
render the template on a fixed anchor conversation ``[system, user]`` with and without the message
and take the difference. Whether that is exact depends on the template, so the constructor
*verifies* it by probing (:class:`TemplateProfile`):

* every ordered pair of message kinds (system, user, assistant, assistant with tool calls, tool):
  ``render(anchor + [A, B]) == render(anchor + [A]) + isolated(B)``. A pair that fails is
  **joined** (e.g. Qwen2.5 merges consecutive tool results into one ``user`` turn and closes it
  only after the last one: ``(tool, tool)``): runs of joined messages are rendered together, and
  an append that starts inside such a run is not exact (:meth:`append_break`).
* sample conversations (all kinds, in several orders) must render exactly as the template renders
  them; if one does not, the template is marked not decomposable and *every* append is reported
  not exact, so the pipeline always does a full render (correct, just O(history)).
* text segments start and end at special tokens (``<|im_start|>`` / ``<|im_end|>``), so tokenizing
  segment by segment equals tokenizing the concatenation; this is probed too.

The incremental contract (property tests in ``tests/inference/test_chat_template_render.py``)
------------------------------------------------------------------------------------------
Let ``R`` be a renderer, ``p`` a prelude, ``a``, ``b`` canonical item lists, ``C`` the calls of ``a``.

(a) **Append is exact unless** ``R.append_break(a, b)`` names a reason:
    ``R.render_items(a) + R.render_items(b, calls=C) == R.render_items(a + b)``. Reasons:
    ``"template"`` (not decomposable), ``"joined"`` (``b`` continues a joined run of ``a``, e.g. a
    tool result after a tool result on Qwen2.5), ``"assistant_turn"`` (``b`` starts with
    assistant-side items that belong in the same assistant message as the end of ``a``).
    Remote MCP items render as the calls and outputs they stand for
    (:mod:`inference.hosted_items`; ``C`` then also holds each approval request as
    :func:`~inference.hosted_items.call_of` gives it): ``tests/inference/test_hosted_items.py``.
(b) **It is the template's rendering**, at text level: ``R.prelude_text(p) + R.render_text(a) ==
    template(R.prelude_messages(p) + R.template_messages(a), tools=...)``, and tokens are the
    tokenizer's tokens of each segment. Deliberate differences:
    - a conversation whose first item is a system/developer message while the prelude is empty:
      the template would use that message *instead of* its default system prompt (SmolLM2's "You
      are a helpful AI assistant named SmolLM...", Qwen's "You are Qwen..."); we keep the default
      in the prelude (the prelude depends on the request settings only) and render the item as a
      second system message.
    - assistant turns are tokenized as the model produces them: the generation prompt, then the
      body. When a body starts with whitespace some tokenizers would merge it across that
      boundary in one-shot tokenization; ours matches what the engine's KV cache holds.
    - templates that drop earlier turns' reasoning (``reasoning_dropped`` in the profile): we keep
      it (never rewrite history: it is in the KV cache).
(c) **The model's turn round-trips.** For the canonical completion ``S`` of output items ``O``
    (:meth:`ChatTemplateRenderer.render_completion`: the rendered assistant turn minus the
    generation prompt and minus the post-message tokens), the items ``O'`` that
    :class:`~inference.hermes_parse.HermesStreamParser` parses from ``S`` render back exactly:
    ``R.generation_prompt() + R.history_tokens(S) == R.render_items(O')``. It fails for
    reasoning when the template has no reasoning field (SmolLM2, Qwen2.5): reasoning is then
    dropped from the prompt, while the model's ``<think>`` tokens stay in the history verbatim.

(d) **A cut generation closes as an assistant message does.** For sampled tokens ``s`` that end
    without a stop token, ``R.cut_history(s)`` is ``s`` verbatim + the end-of-turn token + the
    post-message tokens (``<|im_end|>`` ``\\n``), wherever the cut landed: the assistant turn is
    one message, with no header after the generation prompt. With ``O'`` the items the parser
    makes of ``s`` (the cut one ``incomplete``), ``R.generation_prompt() + R.cut_history(s)``
    equals ``R.render_items(O')`` when the cut lands in answer text or right after a
    ``</tool_call>`` and ``s`` is the tokenizer's own tokenization of the text the parser made of
    it (for those cuts, if and only if). It deliberately differs when the cut lands inside a
    ``<tool_call>`` (the full render would close the call and re-serialize its non-JSON
    arguments as a JSON string), on text the parser treats as format or holds back as a possible
    tag, or in ``<think>`` reasoning of a template that drops reasoning (both shipped ones): the
    history keeps what the engine's KV cache holds and what the model wrote. Property tests:
    ``tests/gateway/turn/test_render_cutoff.py``.

Item mapping: user/system messages keep their role; ``developer`` becomes ``system`` unless the
template mentions ``developer``; a run of assistant-side items ``reasoning* message? calls*``
becomes one assistant message (reasoning as ``reasoning_content`` where the template renders it,
else dropped; ``function_call``/``custom_tool_call`` as ``tool_calls`` with Hermes names from
:mod:`inference.hermes_tools`); ``*_call_output`` becomes a ``tool`` message. Templates without
tool support (SmolLM2) get the tools, the calls and the ``<tool_response>`` wrapping emulated in
Qwen2.5's Hermes text format, so one parser serves both.

Special-token text in content is plain text. Hugging Face's and vLLM's chat-template paths tokenize
message text that spells a special token (``<|im_end|>``, ``<|im_start|>system``) as that token,
which lets a user message or a tool output close its own turn and open a fake system turn (prompt
injection). Here every special-token spelling inside item content (message text, reasoning, tool
outputs, call arguments) is swapped for a private-use sentinel character before the template runs,
and when a segment is tokenized each sentinel is encoded as the *text* of that token (a tokenizer
copy with ``encode_special_tokens``), so only the template's own structure yields special tokens.
Text without special-token spellings is tokenized exactly as before. ``render_text`` restores the
spellings (contract (b) is about text).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from inference.browser_tool import BROWSER, browser_namespace
from inference.chat_template_profile import (
    TemplateError,
    TemplateProfile,
    emulated_tools_block,
    native_render,
    probe_template,
)
from inference.content_text import content_text
from inference.hermes_parse import HermesStreamParser
from inference.hermes_tools import (
    CUSTOM_ARG,
    HermesToolCatalog,
    flat_name,
    tool_call_structural_tag,
    tool_choice_line,
    triggered_tool_calls_tag,
)
from inference.hosted_items import tool_view
from inference.item_types import CALL_TYPES, OUTPUT_TYPES, ItemType
from inference.prelude_cache import PreludeCache
from inference.renderer import Constraint, PerToolSet, Prelude, tools_digest
from inference.text_runs import segments
from inference.tool_grammar import GrammarUnavailable, ToolGrammar, check_structural_tag, json_string_ebnf, tool_grammar

__all__ = ["ChatTemplateRenderer", "TemplateError"]

_KEY_VERSION = b"chat-template-v2"
#: assistant-side item -> its place in one assistant message (reasoning, text, calls)
_STAGE = {ItemType.REASONING: 1, ItemType.MESSAGE: 2, ItemType.FUNCTION_CALL: 3, ItemType.CUSTOM_TOOL_CALL: 3}


def _stage(item: Mapping[str, Any]) -> int:
    """1-3 for assistant-side items, 0 for everything else."""
    kind = item.get("type", "message")
    if kind == "message":
        return 2 if item.get("role") == "assistant" else 0
    return _STAGE.get(kind, 0)


def _arguments(raw: Any) -> Any:
    """Call arguments as the template wants them (an object); invalid JSON stays a string."""
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


class ChatTemplateRenderer:
    """:class:`inference.renderer.Renderer` for models prompted through their own chat template."""

    family = "chat_template"

    def __init__(
        self, folder: str | Path | None = None, *, tokenizer: Any = None, chat_template: str | None = None
    ) -> None:
        if tokenizer is None:
            if folder is None:
                raise TypeError("ChatTemplateRenderer needs a model folder or a tokenizer")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        template = chat_template or tokenizer.chat_template
        if not template:
            raise TemplateError("the tokenizer has no chat template")
        self._hf = tokenizer
        self._fast = tokenizer.backend_tokenizer
        self.template = template
        self.profile: TemplateProfile = probe_template(tokenizer, template, self._encode)
        p = self.profile
        self.stop_token_ids: tuple[int, ...] = p.stop_token_ids
        self._gp_tokens = self._encode(p.generation_prompt)
        self._preludes = PreludeCache()
        #: each turn's parser reads the tools' catalog: built once per tool set
        self._catalogs = PerToolSet(HermesToolCatalog)
        #: a tool set with the built-in browser appended (``inference.browser_tool``): the same tuple
        #: for the same tools, so the catalogs above are found again by identity
        self._with_browser = PerToolSet(lambda tools: (*tools, browser_namespace()))
        self._template_hash = hashlib.blake2b(template.encode(), digest_size=8).digest()
        self._init_specials()

    @property
    def tokenizer(self) -> Any:
        return self._hf

    def _encode(self, text: str) -> list[int]:
        parts = segments(text)
        if len(parts) == 1:
            return self._fast.encode(text, add_special_tokens=False).ids
        # a run longer than MAX_RUN (inference/text_runs.py): cut, and tokenized by encode_batch,
        # which releases the GIL (encode holds it: 1 MB of "中" froze the event loop 2.7 s)
        out: list[int] = []
        for enc in self._fast.encode_batch(parts, add_special_tokens=False):
            out += enc.ids
        return out

    # -- special-token text in content (see the module docstring) ------------------------------

    #: sentinel for the i-th special token: a supplementary private-use character
    _SENTINEL_BASE = 0xF0000

    def _init_specials(self) -> None:
        from tokenizers import Tokenizer

        added = self._fast.get_added_tokens_decoder().values()
        specials = sorted({t.content for t in added if t.special and t.content}, key=len, reverse=True)
        self._specials = specials
        self._special_re = re.compile("|".join(re.escape(t) for t in specials)) if specials else None
        self._special_firsts = frozenset(t[0] for t in specials)
        self._sentinels = {t: chr(self._SENTINEL_BASE + i) for i, t in enumerate(specials)}
        self._sentinel_re = re.compile(
            f"[{chr(self._SENTINEL_BASE)}-{chr(self._SENTINEL_BASE + max(len(specials) - 1, 0))}]"
        )
        plain = Tokenizer.from_str(self._fast.to_str())
        plain.encode_special_tokens = True
        self._plain_ids = {t: plain.encode(t, add_special_tokens=False).ids for t in specials}

    def _esc(self, text: str) -> str:
        """Content text with special-token spellings replaced by their sentinels."""
        if self._special_re is None or not any(c in text for c in self._special_firsts):
            return text
        return self._special_re.sub(lambda m: self._sentinels[m.group(0)], text)

    def _esc_obj(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._esc(value)
        if isinstance(value, dict):
            return {self._esc(k) if isinstance(k, str) else k: self._esc_obj(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._esc_obj(v) for v in value]
        return value

    def _unesc(self, text: str) -> str:
        if not self._specials or not self._sentinel_re.search(text):
            return text
        return self._sentinel_re.sub(lambda m: self._specials[ord(m.group(0)) - self._SENTINEL_BASE], text)

    def _encode_segment(self, text: str) -> list[int]:
        """``_encode``, except that sentinels become the plain-text tokens of their special token."""
        if not self._specials or not self._sentinel_re.search(text):
            return self._encode(text)
        out: list[int] = []
        pos = 0
        for m in self._sentinel_re.finditer(text):
            if m.start() > pos:
                out += self._encode(text[pos : m.start()])
            out += self._plain_ids[self._specials[ord(m.group(0)) - self._SENTINEL_BASE]]
            pos = m.end()
        if pos < len(text):
            out += self._encode(text[pos:])
        return out

    # -- prelude -------------------------------------------------------------------------------

    def model_tools(self, prelude: Prelude) -> tuple[dict[str, Any], ...]:
        """The tools the model is shown: the prelude's, and its built-in ``browser`` as a namespace
        of functions (these templates have no built-in tools of their own)."""
        if BROWSER in prelude.builtin:
            return self._with_browser(prelude.tools)
        return prelude.tools

    def prelude_key(self, prelude: Prelude) -> bytes:
        """blake2b of the template and the settings that reach the prompt (reasoning effort does
        not: these templates have no place for it, so changing it needs no re-render)."""
        payload = orjson.dumps([prelude.instructions, prelude.tool_choice], option=orjson.OPT_SORT_KEYS, default=str)
        return hashlib.blake2b(
            _KEY_VERSION + self._template_hash + payload + tools_digest(self.model_tools(prelude)), digest_size=16
        ).digest()

    def prelude_messages(self, prelude: Prelude) -> list[dict[str, Any]]:
        """The system message built from the prelude (none when it would be empty: the template
        then puts its own default system prompt, if it has one)."""
        catalog = HermesToolCatalog(self.model_tools(prelude))
        lines = [prelude.instructions] if prelude.instructions else []
        if catalog:
            choice = tool_choice_line(prelude.tool_choice)
            if choice:
                lines.append(choice)
            if not self.profile.native_tools:
                lines.append(emulated_tools_block(catalog.schemas()))
        return [{"role": "system", "content": "\n\n".join(lines)}] if lines else []

    def prelude_text(self, prelude: Prelude) -> str:
        catalog = HermesToolCatalog(self.model_tools(prelude))
        tools = catalog.schemas() if catalog and self.profile.native_tools else None
        probe = self.profile.probe_user
        text = native_render(self._hf, self.template, self.prelude_messages(prelude) + [probe[0]], tools)
        if not text.endswith(probe[1]):
            raise TemplateError("the template renders the first user message differently after this prelude")
        return text[: len(text) - len(probe[1])]

    def render_prelude(self, prelude: Prelude) -> list[int]:
        return self._preludes.tokens(self.prelude_key(prelude), lambda: self._encode(self.prelude_text(prelude)))

    # -- items -> template messages ------------------------------------------------------------

    def _renders(self, item: Mapping[str, Any]) -> bool:
        """Whether an item contributes to the prompt at all."""
        kind = item.get("type", "message")
        if kind == "reasoning":
            return self.profile.reasoning and bool(self._reasoning_text(item))
        return kind == "message" or kind in CALL_TYPES or kind in OUTPUT_TYPES

    @staticmethod
    def _reasoning_text(item: Mapping[str, Any]) -> str:
        return content_text(item.get("content")) or content_text(item.get("summary"))

    def template_messages(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """The template messages of ``items`` (assistant-side runs grouped into one message)."""
        return [m for m, _ in self._messages(items, calls)]

    def _messages(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None
    ) -> list[tuple[dict[str, Any], str]]:
        out: list[tuple[dict[str, Any], str]] = []
        group: list[Mapping[str, Any]] = []
        local: dict[str, Mapping[str, Any]] = {}
        last_stage = 0
        for item in tool_view(items):  # remote MCP items as the calls and outputs they stand for
            if not self._renders(item):
                continue
            kind = item.get("type", "message")
            if kind in CALL_TYPES:
                local[str(item.get("call_id"))] = item
            stage = _stage(item)
            if group and (not stage or stage < last_stage or (stage == last_stage and stage != 3)):
                out.append(self._assistant(group))
                group = []
            last_stage = stage
            if stage:
                group.append(item)
            else:
                out.append(self._other(item, kind, local, calls))
        if group:
            out.append(self._assistant(group))
        return out

    def _other(
        self,
        item: Mapping[str, Any],
        kind: str,
        local: Mapping[str, Mapping[str, Any]],
        calls: Mapping[str, Mapping[str, Any]] | None,
    ) -> tuple[dict[str, Any], str]:
        p = self.profile
        if kind in OUTPUT_TYPES:
            out = item.get("output")
            text = self._esc(out if isinstance(out, str) else content_text(out))
            if not p.wraps_tool_response:
                text = f"<tool_response>\n{text}\n</tool_response>"
            msg: dict[str, Any] = {"role": p.tool_role, "content": text}
            call = local.get(str(item.get("call_id"))) or (calls or {}).get(str(item.get("call_id")))
            if call is None or not call.get("name"):
                call = item  # an output may carry its call's name (an expanded mcp_call's does)
            if call.get("name"):
                msg["name"] = flat_name(str(call["name"]), call.get("namespace"))
            return msg, "tool"
        role = str(item.get("role") or "user")
        if role == "developer" and not p.knows_developer:
            role = "system"
        return (
            {"role": role, "content": self._esc(content_text(item.get("content")))},
            ("system" if role != "user" else "user"),
        )

    def _assistant(self, group: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], str]:
        reasoning = [self._esc(self._reasoning_text(it)) for it in group if it.get("type") == ItemType.REASONING]
        texts = [
            self._esc(content_text(it.get("content")))
            for it in group
            if it.get("type", ItemType.MESSAGE) == ItemType.MESSAGE
        ]
        calls: list[dict[str, Any]] = []
        for it in group:
            if it.get("type") == ItemType.FUNCTION_CALL:
                args = self._esc_obj(_arguments(it.get("arguments")))
            elif it.get("type") == ItemType.CUSTOM_TOOL_CALL:
                args = {CUSTOM_ARG: self._esc(str(it.get("input") or ""))}
            else:
                continue
            calls.append(
                {
                    "type": "function",
                    "function": {"name": flat_name(str(it.get("name")), it.get("namespace")), "arguments": args},
                }
            )
        content = "".join(texts)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = "\n".join(reasoning)
        if calls and self.profile.native_tool_calls:
            msg["tool_calls"] = calls
        elif calls:
            blocks = "\n".join(
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
                )
                + "\n</tool_call>"
                for c in calls
            )
            msg["content"] = f"{content}\n{blocks}" if content else blocks
        return msg, ("assistant_calls" if calls and self.profile.native_tool_calls else "assistant")

    # -- rendering -----------------------------------------------------------------------------

    def _segments(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None
    ) -> list[tuple[str, bool]]:
        """(text, is_assistant) per run of joined template messages."""
        p = self.profile
        runs: list[list[tuple[dict[str, Any], str]]] = []
        for msg, kind in self._messages(items, calls):
            if runs and (runs[-1][-1][1], kind) in p.joins:
                runs[-1].append((msg, kind))
            else:
                runs.append([(msg, kind)])
        out = []
        for run in runs:
            text = p.isolated(self._hf, self.template, [m for m, _ in run])
            out.append((text, run[0][1].startswith("assistant")))
        return out

    def render_text(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> str:
        """The text :meth:`render_items` tokenizes (for tests and debugging)."""
        return self._unesc("".join(t for t, _ in self._segments(items, calls)))

    def render_items(
        self, items: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of ``items`` only, one run of template messages at a time (O(len(items))).

        ``calls`` (call_id -> call item of the whole chain) gives tool results their tool name;
        an unknown call is not an error here (the Hermes templates do not print the name).
        """
        gp = self.profile.generation_prompt
        out: list[int] = []
        for text, assistant in self._segments(items, calls):
            if assistant and text.startswith(gp):
                out += self._gp_tokens
                text = text[len(gp) :]
            out += self._encode_segment(text)
        return out

    def append_break(self, previous: Sequence[Mapping[str, Any]], new_items: Sequence[Mapping[str, Any]]) -> str | None:
        """Why appending ``new_items`` to a rendering of ``previous`` is not exact, or ``None``.

        O(1) in the usual case: looks only at the last rendered item of ``previous`` and the first
        rendered item of ``new_items`` (a remote MCP item through what it stands for:
        :func:`inference.hosted_items.tool_view` of that item alone). The pipeline must
        full-render when this is not ``None``.
        """
        if not self.profile.decomposable:
            return "template"
        first = last = None
        for item in new_items:
            first = next((it for it in tool_view((item,)) if self._renders(it)), None)
            if first is not None:
                break
        for i in range(len(previous) - 1, -1, -1):
            last = next((it for it in reversed(tool_view((previous[i],))) if self._renders(it)), None)
            if last is not None:
                break
        if first is None or last is None:
            return None
        s_last, s_first = _stage(last), _stage(first)
        if s_last and s_first and not (s_first < s_last or (s_first == s_last != 3)):
            return "assistant_turn"
        kinds = self._messages([last, first], None)
        if len(kinds) == 2 and (kinds[0][1], kinds[1][1]) in self.profile.joins:
            return "joined"
        return None

    # -- generation ----------------------------------------------------------------------------

    def generation_prompt(self) -> list[int]:
        return list(self._gp_tokens)

    def history_tokens(self, sampled: Sequence[int]) -> list[int]:
        """Sampled tokens as they stay in history.

        If the last sampled token is a stop token (``<|im_end|>``, or the tokenizer's EOS when that
        differs), it becomes the template's end-of-turn token followed by the template's
        post-message tokens (``\\n`` for ChatML), so the next message appends exactly where a full
        render would put it. The stop token itself was never fed to the model, so replacing it
        costs no KV cache. Anything else (a cut-off generation) is returned verbatim.
        """
        out = list(sampled)
        if out and out[-1] in self.stop_token_ids:
            out[-1] = self.profile.end_token
            out += self.profile.post_tokens
        return out

    def cut_history(self, sampled: Sequence[int]) -> list[int]:
        """A generation cut off before its stop token, closed as the template closes an assistant
        message: the sampled tokens verbatim, then the end-of-turn token and the post-message
        tokens (``<|im_end|>`` ``\\n`` for ChatML) — wherever the cut landed (reasoning, text, a
        ``<tool_call>`` body): the whole assistant turn is one message with no header of its own.
        Contract (d) in the module docstring says when this equals a full render."""
        if sampled and sampled[-1] in self.stop_token_ids:
            return self.history_tokens(sampled)
        return [*sampled, self.profile.end_token, *self.profile.post_tokens]

    def render_completion(self, outputs: Sequence[Mapping[str, Any]]) -> list[int]:
        """The canonical tokens a model samples for ``outputs`` (contract (c)): their rendering
        minus the generation prompt and minus the post-message tokens, ending in end-of-turn."""
        tokens = self.render_items(outputs)
        gp, post = self._gp_tokens, list(self.profile.post_tokens)
        if tokens[: len(gp)] != gp or (post and tokens[-len(post) :] != post):
            raise ValueError("outputs do not render as one assistant turn")
        return tokens[len(gp) : len(tokens) - len(post)]

    def token_bytes(self, token_id: int) -> bytes:
        """UTF-8 of the token's text (a token that is part of a multi-byte character decodes to
        U+FFFD: the tokenizer's decoder works on whole characters)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def count_text_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def constraint(self, prelude: Prelude, text_format: Mapping[str, Any] | None) -> Constraint | None:
        """vLLM ``StructuredOutputsParams`` fields for this turn, or ``None``.

        ``tool_choice: "required"`` -> one Hermes call to one of the offered tools; a named
        tool -> one call to it. Both as a structural tag whose ``arguments`` follow the tool's
        own JSON schema (the canonical call form, so the parser and contract (c) apply), and whose
        ``input`` follows a custom tool's grammar, JSON-escaped (``inference.tool_grammar``).
        Otherwise ``text.format`` json_schema -> ``json``, json_object -> ``json_object``; else,
        under ``auto`` with grammar tools, a triggered tag: free text until ``<tool_call>``, then
        a call whose body is constrained. Grammars that cannot be enforced are left out and named
        in ``fallbacks`` (their prose stays in the tool descriptions).
        """
        catalog = HermesToolCatalog(self.model_tools(prelude))
        grammars, fallbacks = self._grammars(catalog) if catalog and prelude.tool_choice != "none" else ({}, [])
        fields = self._constraint_fields(catalog, prelude.tool_choice, text_format, grammars)
        if grammars and fields and "structural_tag" in fields:
            try:
                check_structural_tag(fields["structural_tag"])
            except GrammarUnavailable:
                fallbacks += [g.syntax for g in grammars.values()]
                fields = self._constraint_fields(catalog, prelude.tool_choice, text_format, {})
        if fields is None and not fallbacks:
            return None
        return Constraint(fields, fallbacks)

    @staticmethod
    def _grammars(catalog: HermesToolCatalog) -> tuple[dict[str, ToolGrammar], list[str]]:
        found: dict[str, ToolGrammar] = {}
        fallbacks: list[str] = []
        for flat in catalog.names():
            tool = catalog.tool_of(flat)
            if not tool.custom:
                continue
            try:
                grammar = tool_grammar(tool.tool)
            except GrammarUnavailable as exc:
                fallbacks.append(exc.syntax)
                continue
            if grammar is None:
                continue
            try:  # the call carries the input as a JSON string: the grammar of its escaped spelling
                found[flat] = ToolGrammar(grammar.syntax, json_string_ebnf(grammar.ebnf))
            except ValueError:
                fallbacks.append(grammar.syntax)
        return found, fallbacks

    @staticmethod
    def _constraint_fields(
        catalog: HermesToolCatalog,
        choice: Any,
        text_format: Mapping[str, Any] | None,
        grammars: Mapping[str, ToolGrammar],
    ) -> dict[str, Any] | None:
        if catalog and choice == "required":
            return {"structural_tag": tool_call_structural_tag(catalog, catalog.names(), grammars)}
        if catalog and isinstance(choice, Mapping) and choice.get("name"):
            flat = flat_name(str(choice["name"]), choice.get("namespace"))
            if flat in catalog.names():
                return {"structural_tag": tool_call_structural_tag(catalog, [flat], grammars)}
        if text_format:
            if text_format.get("type") == "json_schema" and isinstance(text_format.get("schema"), Mapping):
                return {"json": dict(text_format["schema"])}
            if text_format.get("type") == "json_object":
                return {"json_object": True}
        if grammars and choice in ("auto", None):
            return {"structural_tag": triggered_tool_calls_tag(catalog, grammars)}
        return None

    def parser(self, prelude: Prelude) -> HermesStreamParser:
        return HermesStreamParser(
            self._fast,
            self._catalogs(self.model_tools(prelude)),
            stop_token_ids=self.stop_token_ids,
        )
