"""Prompt-injection heuristics for tool outputs.

A tool output (a web page, a file, a command's output) is data the model reads as if it were part
of the conversation; an attacker who controls it can try to steer the agent. These heuristics look
for the shapes such attempts take:

* instructions aimed at the model: "ignore all previous instructions", "you are now ...",
  "new system prompt:", "do not tell the user";
* fake chat-template control tokens (``<|im_start|>``, ``<|start|>system``, ``[INST]``,
  ``<<SYS>>``) that try to open a system or developer turn inside data;
* exfiltration: sending secrets, keys or environment variables somewhere, ``curl`` with
  ``$(cat ~/.ssh/...)``;
* hidden text: Unicode tag characters or runs of zero-width characters, instruction words inside
  HTML comments.

Each rule has a weight; an item's score is ``1 - prod(1 - w)`` over the distinct rules that matched,
so two weak signals together count more than one. Items at or above ``threshold`` get a verdict
(``flag`` by default; an operator can make it ``block``). Only tool outputs are examined by default:
a user typing "ignore previous instructions" is the user's own prompt, not an injection.

The verdict's hint is a short excerpt around the strongest match with any secret masked, so a
reviewer sees what triggered it without the gateway storing the whole output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from security.classify import Action, ItemText, Verdict
from security.secrets import find_secrets


@dataclass(frozen=True, slots=True)
class Heuristic:
    name: str
    pattern: re.Pattern[str]
    weight: float
    #: groups of lowercase substrings; every group needs one hit for the regex to run (prefilter)
    needles: tuple[tuple[str, ...], ...] = ()
    #: only text with non-ASCII characters can match (``str.isascii`` is a cheap prefilter)
    non_ascii: bool = False


_I = re.IGNORECASE
HEURISTICS: tuple[Heuristic, ...] = (
    Heuristic("ignore_instructions", re.compile(
        r"\b(?:ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}?\b(?:all|any|the|your|previous|prior|above|"
        r"earlier|preceding|system|developer)\b[^.\n]{0,30}?\b(?:instructions?|prompts?|rules|directions|"
        r"guidelines|guardrails|messages?)\b", _I), 0.8,
        (("ignore", "disregard", "forget", "override", "bypass"),)),
    Heuristic("role_override", re.compile(
        r"\byou are now\b|\bfrom now on,? you (?:are|will|must|should)\b|\bnew (?:system |developer )?"
        r"(?:instructions?|prompt)\s*:|\bact as (?:the |an? )?(?:system|developer|admin|root)\b|"
        r"\b(?:enter|enable|activate) (?:developer|god|dan|jailbreak) mode\b", _I), 0.6,
        (("you are now", "from now on", "instruction", "prompt", "act as", " mode"),)),
    Heuristic("fake_system_turn", re.compile(
        r"(?im)^\s*(?:#{1,3}\s*)?(?:system|developer)\s*(?:prompt|message|override|instructions?)?\s*:\s*\S|"
        r"</?(?:system|system-reminder|instructions)>", _I | re.MULTILINE), 0.45, (("system", "developer", "instructions>"),)),
    Heuristic("chat_template_token", re.compile(
        r"<\|(?:im_start|im_end|im_sep|start|end|message|channel|constrain|return|call|system|user|assistant|"
        r"endoftext|eot_id|start_header_id|end_header_id|begin_of_text)\|>|\[/?INST\]|<</?SYS>>|"
        r"<start_of_turn>|<end_of_turn>", _I), 0.9,
        (("<|", "[inst]", "[/inst]", "<<sys>>", "<</sys>>", "<start_of_turn>", "<end_of_turn>"),)),
    Heuristic("exfiltration", re.compile(
        r"\b(?:send|post|upload|exfiltrate|forward|leak|transmit|e-?mail|paste)\b[^.\n]{0,60}?"
        r"(?:api[_ ]?keys?|secrets?|credentials?|passwords?|tokens?|\.env\b|ssh[_ ]?keys?|private[_ ]keys?|"
        r"environment variables|id_rsa)[^.\n]{0,80}?(?:\bto\b|https?://)", _I), 0.8,
        (("send", "post", "upload", "exfiltrate", "forward", "leak", "transmit", "mail", "paste"),
         ("key", "secret", "credential", "password", "token", ".env", "environment variables", "id_rsa"))),
    Heuristic("shell_exfiltration", re.compile(
        r"\b(?:curl|wget|nc|fetch)\b[^\n]{0,200}?(?:\$\(|`)[^\n]{0,60}?(?:\.ssh|\.env|id_rsa|\.aws|printenv|"
        r"\benv\b|/etc/passwd|credentials)", _I), 0.9,
        (("curl", "wget", "nc", "fetch"), ("$(", "`"))),
    Heuristic("conceal_from_user", re.compile(
        r"\b(?:do not|don't|never)\s+(?:tell|inform|mention|reveal|show)\b[^.\n]{0,20}?\b(?:the )?user\b|"
        r"\bwithout (?:telling|informing|alerting) the user\b|\bsecretly\b", _I), 0.7, (("user", "secretly"),)),
    Heuristic("hidden_text", re.compile(r"[\U000E0000-\U000E007F]{4,}|[\u200b\u200c\u200d\u2060\ufeff]{8,}"), 0.7,
              non_ascii=True),
    Heuristic("comment_instruction", re.compile(
        r"<!--(?:(?!-->)[\s\S]){0,400}?\b(?:ignore|instructions?|assistant|AI agent|language model|LLM)\b", _I),
        0.5, (("<!--",),)),
)

EXCERPT_CHARS = 80


def injection_score(text: str) -> tuple[float, Heuristic | None, tuple[int, int]]:
    """(score, strongest heuristic, its span) for ``text``; (0, None, (0, 0)) when nothing matched."""
    miss = 1.0
    best: Heuristic | None = None
    span = (0, 0)
    lower = text.lower()
    ascii_only = text.isascii()
    for h in HEURISTICS:
        if (h.non_ascii and ascii_only) or not all(any(n in lower for n in group) for group in h.needles):
            continue
        m = h.pattern.search(text)
        if m is None:
            continue
        miss *= 1.0 - h.weight
        if best is None or h.weight > best.weight:
            best, span = h, m.span()
    return 1.0 - miss, best, span


def excerpt(text: str, span: tuple[int, int], width: int = EXCERPT_CHARS) -> str:
    """A short, single-line excerpt around ``span`` that cannot leak a secret.

    Secrets are found in a wider region than the excerpt (a token cut by the window would no
    longer look like one) and replaced whole; a word cut at either edge is dropped (so no prefix
    of a long token survives); control characters are escaped."""
    start = max(0, span[0] - width // 4)
    end = min(len(text), start + width)
    lo, hi = max(0, start - 4096), min(len(text), end + 4096)
    secrets = [(f.start + lo, f.end + lo, f.category) for f in find_secrets(text[lo:hi])]
    # widen the window over secrets it cuts (they are replaced whole below)
    for s, e, _ in secrets:
        if s < start < e:
            start = s
        if s < end < e:
            end = e
    # drop words cut by the window's edges
    if start > 0 and not text[start - 1].isspace():
        while start < end and not text[start].isspace():
            start += 1
    if end < len(text) and not text[end].isspace():
        while end > start and not text[end - 1].isspace():
            end -= 1
    out: list[str] = []
    pos = start
    for s, e, category in sorted(secrets):
        if e <= pos or s >= end:
            continue
        out.append(text[pos:s])
        out.append(f"[REDACTED:{category}]")
        pos = e
    out.append(text[pos:end])
    piece = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in "".join(out).strip())
    return ("…" if start > 0 else "") + piece + ("…" if end < len(text) else "")


class InjectionHeuristics:
    """The prompt-injection classifier (tool outputs only, unless ``all_items``)."""

    source = "injection"

    def __init__(self, action: Action = "flag", threshold: float = 0.5, all_items: bool = False) -> None:
        self.action = action
        self.threshold = threshold
        self.all_items = all_items

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for it in items:
            if not (it.tool_output or self.all_items) or not it.text:
                continue
            score, best, span = injection_score(it.text)
            if best is not None and score >= self.threshold:
                verdicts.append(Verdict(self.action, "prompt_injection", score, it.index, it.item_id, best.name,
                                        self.source, "a likely prompt injection", excerpt(it.text, span)))
        return verdicts
