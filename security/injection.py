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
from collections.abc import Sequence
from dataclasses import dataclass

from security.classifiers import Action, ItemText, Verdict
from security.secrets import find_secrets


@dataclass(frozen=True, slots=True)
class Heuristic:
    name: str
    #: the whole rule, written in lowercase (documentation, and the IGNORECASE fallback below)
    pattern: re.Pattern[str]
    weight: float
    #: groups of lowercase substrings; every group needs one hit for the regex to run (prefilter).
    #: The first group lists every way a match can *start*: the regex is only tried (``match``)
    #: where ``str.find`` locates one of them, so the per-character cost is ``find``'s, not ``re``'s.
    needles: tuple[tuple[str, ...], ...] = ()
    #: only text with non-ASCII characters can match
    non_ascii: bool = False
    #: ``pattern`` with IGNORECASE, for the rare text whose lowercase changes length
    pattern_ci: re.Pattern[str] | None = None
    #: ``pattern``'s top-level alternatives, compiled one by one and tried at the anchor positions
    #: of the lowercased text (a regex search from every position costs 30-100 ns per character
    #: and rule; ``str.find`` costs about one)
    branches: tuple[re.Pattern[str], ...] = ()
    #: a match counts only when its line holds nothing before it but blanks and ``#``
    line_start: bool = False


def _top_level_alternatives(regex: str) -> list[str]:
    out, depth, in_class, i, start = [], 0, False, 0, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(regex[start:i])
            start = i + 1
        i += 1
    out.append(regex[start:])
    return out


def _h(
    name: str,
    regex: str,
    weight: float,
    *needles: tuple[str, ...],
    flags: int = 0,
    non_ascii: bool = False,
    line_start: bool = False,
) -> Heuristic:
    return Heuristic(
        name,
        re.compile(regex, flags),
        weight,
        needles,
        non_ascii,
        re.compile(regex, flags | re.IGNORECASE),
        tuple(re.compile(b, flags) for b in _top_level_alternatives(regex)),
        line_start,
    )


HEURISTICS: tuple[Heuristic, ...] = (
    _h(
        "ignore_instructions",
        r"(?:ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}?\b(?:all|any|the|your|previous|prior|above|"
        r"earlier|preceding|system|developer)\b[^.\n]{0,30}?\b(?:instructions?|prompts?|rules|directions|"
        r"guidelines|guardrails|messages?)\b",
        0.8,
        ("ignore", "disregard", "forget", "override", "bypass"),
    ),
    _h(
        "role_override",
        r"you are now\b|from now on,? you (?:are|will|must|should)\b|new (?:system |developer )?"
        r"(?:instructions?|prompt)\s*:|act as (?:the |an? )?(?:system|developer|admin|root)\b|"
        r"(?:enter|enable|activate) (?:developer|god|dan|jailbreak) mode\b",
        0.6,
        ("you are now", "from now on", "new ", "act as", "enter ", "enable ", "activate "),
    ),
    _h(
        "fake_system_turn",
        r"(?:system|developer)[ \t]*(?:prompt|message|override|instructions?)?[ \t]*:[ \t]*\S",
        0.45,
        ("system", "developer"),
        line_start=True,
    ),
    _h(
        "fake_system_tag",
        r"</?(?:system|system-reminder|instructions)>",
        0.45,
        ("<system", "</system", "<instructions", "</instructions"),
    ),
    _h(
        "chat_template_token",
        r"<\|(?:im_start|im_end|im_sep|start|end|message|channel|constrain|return|call|system|user|assistant|"
        r"endoftext|eot_id|start_header_id|end_header_id|begin_of_text)\|>|\[/?inst\]|<</?sys>>|"
        r"<start_of_turn>|<end_of_turn>",
        0.9,
        ("<|", "[inst]", "[/inst]", "<<sys>>", "<</sys>>", "<start_of_turn>", "<end_of_turn>"),
    ),
    _h(
        "exfiltration",
        r"(?:send|post|upload|exfiltrate|forward|leak|transmit|e-?mail|paste)\b[^.\n]{0,60}?"
        r"(?:api[_ ]?keys?|secrets?|credentials?|passwords?|tokens?|\.env\b|ssh[_ ]?keys?|private[_ ]keys?|"
        r"environment variables|id_rsa)[^.\n]{0,80}?(?:\bto\b|https?://)",
        0.8,
        ("send", "post", "upload", "exfiltrate", "forward", "leak", "transmit", "email", "e-mail", "paste"),
        ("key", "secret", "credential", "password", "token", ".env", "environment variables", "id_rsa"),
    ),
    _h(
        "shell_exfiltration",
        r"(?:curl|wget|nc|fetch)\b[^\n]{0,200}?(?:\$\(|`)[^\n]{0,60}?(?:\.ssh|\.env|id_rsa|\.aws|printenv|"
        r"\benv\b|/etc/passwd|credentials)",
        0.9,
        ("curl", "wget", "nc ", "fetch"),
        ("$(", "`"),
    ),
    _h(
        "conceal_from_user",
        r"(?:do not|don't|never)\s+(?:tell|inform|mention|reveal|show)\b[^.\n]{0,20}?\b(?:the )?user\b|"
        r"without (?:telling|informing|alerting) the user\b|secretly\b",
        0.7,
        ("do not", "don't", "never", "without", "secretly"),
    ),
    _h("hidden_text", r"[\U000E0000-\U000E007F]{4,}|[\u200b\u200c\u200d\u2060\ufeff]{8,}", 0.7, non_ascii=True),
    _h(
        "comment_instruction",
        r"<!--(?:(?!-->)[\s\S]){0,400}?\b(?:ignore|instructions?|assistant|ai agent|language model|llm)\b",
        0.5,
        ("<!--",),
    ),
)

EXCERPT_CHARS = 80
_ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")


_TAGS = re.compile(r"[\U000E0000-\U000E007F]{4,}")
_ZW_RUN = re.compile(r"[\u200b\u200c\u200d\u2060\ufeff]{8,}")


_HIDDEN_ANY = re.compile(r"[\U000E0000-\U000E007F\u200b\u200c\u200d\u2060\ufeff]")


def _hidden(text: str) -> re.Match[str] | None:
    """The hidden-text heuristic without its slow alternation: one character-class scan finds
    the first candidate; the run regexes only start from there."""
    if text.isascii():
        return None
    first = _HIDDEN_ANY.search(text)
    if first is None:
        return None
    return _TAGS.search(text, first.start()) or _ZW_RUN.search(text, first.start())


def _search(h: Heuristic, patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    """IGNORECASE fallback: a plain search over the original text."""
    for p in patterns:
        for m in p.finditer(text):
            if not h.line_start or _at_line_start(text, m.start()):
                return m
    return None


def _anchored(h: Heuristic, lower: str) -> re.Match[str] | None:
    """Try the branches only where an anchor (a possible match start) occurs."""
    for word in h.needles[0]:
        i = lower.find(word)
        while i != -1:
            for p in h.branches:
                m = p.match(lower, i)
                if m is not None and (not h.line_start or _at_line_start(lower, i)):
                    return m
            i = lower.find(word, i + 1)
    return None


def _at_line_start(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1 : pos].strip(" \t#")


def injection_score(text: str) -> tuple[float, Heuristic | None, tuple[int, int]]:
    """(score, strongest heuristic, its span) for ``text``; (0, None, (0, 0)) when nothing matched."""
    miss = 1.0
    best: Heuristic | None = None
    span = (0, 0)
    lower = text.lower()
    aligned = len(lower) == len(text)
    for h in HEURISTICS:
        if h.non_ascii:  # the pattern documents it; _hidden() runs it faster
            m = _hidden(text)
        elif not all(any(n in lower for n in group) for group in h.needles):
            continue
        elif not aligned and h.pattern_ci is not None:
            m = _search(h, (h.pattern_ci,), text)
        else:
            m = _anchored(h, lower)
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
        return self.scan(items)

    def scan(self, items: Sequence[ItemText]) -> list[Verdict]:
        """CPU only, no I/O: the composite may run it in a worker thread for large inputs."""
        verdicts: list[Verdict] = []
        for it in items:
            if not (it.tool_output or self.all_items) or not it.text:
                continue
            score, best, span = injection_score(it.text)
            if best is not None and score >= self.threshold:
                verdicts.append(
                    Verdict(
                        self.action,
                        "prompt_injection",
                        score,
                        it.index,
                        it.item_id,
                        best.name,
                        self.source,
                        "a likely prompt injection",
                        excerpt(it.text, span),
                    )
                )
        return verdicts
