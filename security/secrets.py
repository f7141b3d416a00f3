"""Credential and secret detector: token formats with fixed shapes, plus entropy-gated assignments.

Coding agents read ``.env`` files and configs all day, so a tool output holding a secret is common
and usually not malice: the default action is ``flag`` (an operator can make any category block,
see ``Composite`` overrides). Precision matters as much as recall: a detector that flags every
``password = get_password()`` teaches reviewers to ignore it. Hence:

* fixed-shape tokens (AWS key ids, GitHub, Slack, Google, OpenAI-style ``sk-`` keys) are matched
  by their documented prefixes and lengths, and random-looking ones also need Shannon entropy;
* PEM private keys need a base64 body after the header (code that merely *mentions* the header,
  like a PEM parser, is not a key);
* JWTs need a header segment that decodes to JSON with an ``alg``;
* generic ``password=`` / ``api_key:`` assignments count only when the value is a literal (quoted,
  or an unquoted ``KEY=value`` config line), is not a placeholder, mixes character classes and
  has enough entropy.

A verdict never carries the value: its ``hint`` is the token type's public prefix and the length.
"""

from __future__ import annotations

import base64
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from security.classifiers import Action, ItemText, Verdict, needle_windows


def shannon_entropy(s: str) -> float:
    """Bits per character of ``s`` (0 for an empty string)."""
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    category: str
    label: str
    pattern: re.Pattern[str]
    score: float
    #: the capture group holding the secret value (0: the whole match)
    group: int = 0
    #: minimum Shannon entropy (bits/char) of the value; 0 = shape alone is enough
    min_entropy: float = 0.0
    #: how many leading characters are a public type prefix, safe to show in a hint
    public_prefix: int = 0
    check: Callable[[str], bool] | None = None
    #: lowercase substrings of which one must occur for the regex to run at all (a fast prefilter:
    #: ``str.__contains__`` is much cheaper than a regex scan, and most text holds no secret)
    needles: tuple[str, ...] = ()
    #: the regex runs in windows of (before, after) characters around needle hits (a match must
    #: fit in one); None: over the whole text whenever a needle occurs
    window: tuple[int, int] | None = (8, 320)


def _jwt_header_ok(token: str) -> bool:
    head = token.split(".", 1)[0]
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return False
    return isinstance(decoded, dict) and "alg" in decoded


_AWS_EXAMPLES = frozenset({"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"})

RULES: tuple[Rule, ...] = (
    Rule(
        "pem_private_key",
        "private_key",
        "a private key",
        re.compile(
            r"-----BEGIN ((?:RSA |EC |DSA |OPENSSH |ENCRYPTED |PGP )?PRIVATE KEY(?: BLOCK)?)-----"
            r"\s*(?:[A-Za-z-]+:[^\n]*\n\s*)*(?:[A-Za-z0-9+/=]{16,}\s*){2,}"
        ),
        0.99,
        needles=("private key",),
        window=None,
    ),
    Rule(
        "aws_access_key_id",
        "aws_access_key_id",
        "an AWS access key id",
        re.compile(r"(?<![A-Z0-9])((?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16})(?![A-Za-z0-9])"),
        0.95,
        group=1,
        min_entropy=3.0,
        public_prefix=4,
        needles=("akia", "asia", "abia", "acca"),
    ),
    Rule(
        "aws_secret_access_key",
        "aws_secret_access_key",
        "an AWS secret access key",
        re.compile(r"(?i)aws_?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"),
        0.95,
        group=1,
        min_entropy=4.0,
        needles=("secret",),
        window=(16, 128),
    ),
    Rule(
        "github_token",
        "github_token",
        "a GitHub token",
        re.compile(
            r"(?<![A-Za-z0-9_])(gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{60,255})"
            r"(?![A-Za-z0-9_])"
        ),
        0.97,
        group=1,
        min_entropy=3.5,
        public_prefix=4,
        needles=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Rule(
        "openai_api_key",
        "api_key",
        "an API key",
        re.compile(
            r"(?<![A-Za-z0-9_-])(sk-(?:proj-|svcacct-|admin-|ant-(?:api\d\d-)?)?[A-Za-z0-9_-]{20,})"
            r"(?![A-Za-z0-9_-])"
        ),
        0.9,
        group=1,
        min_entropy=3.5,
        public_prefix=3,
        needles=("sk-",),
    ),
    Rule(
        "slack_token",
        "slack_token",
        "a Slack token",
        re.compile(r"(?<![A-Za-z0-9])(xox[abposr]-[A-Za-z0-9-]{10,})(?![A-Za-z0-9-])"),
        0.95,
        group=1,
        min_entropy=3.0,
        public_prefix=5,
        needles=("xox",),
    ),
    Rule(
        "google_api_key",
        "google_api_key",
        "a Google API key",
        re.compile(r"(?<![A-Za-z0-9_-])(AIza[0-9A-Za-z_-]{35})(?![A-Za-z0-9_-])"),
        0.95,
        group=1,
        min_entropy=3.5,
        public_prefix=4,
        needles=("aiza",),
    ),
    Rule(
        "jwt",
        "jwt",
        "a JSON Web Token",
        re.compile(r"(?<![A-Za-z0-9_-])(eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,})"),
        0.85,
        group=1,
        public_prefix=3,
        check=_jwt_header_ok,
        needles=("eyj",),
        window=(2, 16384),
    ),
)

#: key names that announce a secret; matched on the lowercased text, then the name is extended to
#: the whole identifier and the assignment after it is checked with anchored regexes (the cost is
#: per keyword hit, not per character)
#: any rule's needle: a text without one (and whose lowercase keeps its positions) gives every rule
#: no window, so one scan in C stands for the per-rule, per-needle ``find`` loop
_ANY_NEEDLE = re.compile(
    "|".join(re.escape(n) for n in sorted({n for r in RULES for n in r.needles}, key=len, reverse=True))
)
_KEYWORD = re.compile(
    r"pass(?:word|wd|phrase)|pwd|secret|api[_-]?key|apikey|(?:access|auth)[_-]?token|"
    r"private[_-]?key|token"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
#: quoted literal after the name: = "value" / ": "value" / : 'value' / => "value"
_QUOTED_TAIL = re.compile(r"[\"']?[ \t]*(?:=|:|=>)[ \t]*([\"'])([^\"'\s]{8,200})\1")
#: unquoted config line after the name: KEY=value / key: value, to the end of the line
_LINE_TAIL = re.compile(r"[ \t]*[=:][ \t]*([^\s\"'`]{8,200})[ \t]*(?:\r?\n|$)")
_LINE_HEAD = re.compile(r"[ \t]*(?:export[ \t]+)?")
_PLACEHOLDER = re.compile(
    r"(?i)^(?:\$\{?|<|%|\{\{|\*+$|x{4,}|\.\.\.)|changeme|example|placeholder|your[_-]|"
    r"redacted|dummy|\bfake|process\.env|os\.environ|getenv|secrets\.|\(|\)"
)


def _generic_ok(value: str) -> bool:
    if _PLACEHOLDER.search(value):
        return False
    classes = sum(
        (
            any(c.islower() for c in value),
            any(c.isupper() for c in value),
            any(c.isdigit() for c in value),
            any(not c.isalnum() for c in value),
        )
    )
    has_digit_or_mixed = any(c.isdigit() for c in value) or (
        any(c.islower() for c in value) and any(c.isupper() for c in value)
    )
    return classes >= 2 and has_digit_or_mixed and shannon_entropy(value) >= 3.0


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret found in a text: what and where, and a safe hint. Never the value itself."""

    rule: str
    category: str
    label: str
    score: float
    start: int
    end: int
    hint: str


def find_secrets(text: str) -> Iterator[Finding]:
    """Every secret in ``text`` (spans may be used to mask it; the value is never returned)."""
    taken: list[tuple[int, int]] = []
    lower = text.lower()
    rules = RULES if len(lower) != len(text) or _ANY_NEEDLE.search(lower) is not None else ()
    for rule in rules:
        if rule.window is None:
            windows = [(0, len(text))] if any(n in lower for n in rule.needles) else []
        else:
            windows = needle_windows(text, lower, rule.needles, *rule.window)
        for m in _scan(rule.pattern, text, windows):
            value = m.group(rule.group)
            if rule.min_entropy and shannon_entropy(value) < rule.min_entropy:
                continue
            if value in _AWS_EXAMPLES or (rule.check is not None and not rule.check(value)):
                continue
            start, end = m.span(rule.group)
            taken.append((start, end))
            yield Finding(rule.name, rule.category, rule.label, rule.score, start, end, _hint(rule, value))
    if len(lower) != len(text):
        lower = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)  # keep positions aligned
    n, last = len(text), 0
    for m in _KEYWORD.finditer(lower):
        if m.start() < last:
            continue  # inside a name already examined (client_secret_token)
        start, end = m.start(), m.end()
        while start > 0 and lower[start - 1] in _NAME_CHARS:
            start -= 1
        while end < n and lower[end] in _NAME_CHARS:
            end += 1
        last = end
        tail = _QUOTED_TAIL.match(text, end)
        group = 2
        if tail is None:
            line_start = text.rfind("\n", 0, start) + 1
            head = _LINE_HEAD.match(text, line_start)
            if head is None or head.end() != start:
                continue
            tail = _LINE_TAIL.match(text, end)
            group = 1
            if tail is None:
                continue
        value = tail.group(group)
        vstart, vend = tail.span(group)
        if any(s < vend and vstart < e for s, e in taken) or not _generic_ok(value):
            continue
        taken.append((vstart, vend))
        password = any(w in lower[start:end] for w in ("pass", "pwd"))
        entropy = shannon_entropy(value)
        yield Finding(
            "assignment",
            "password" if password else "generic_secret",
            "a password" if password else "a secret value",
            min(0.9, 0.45 + 0.1 * entropy),
            vstart,
            vend,
            f"assignment to a {'password' if password else 'secret'}-like key, {len(value)} chars",
        )


def _scan(pattern: re.Pattern[str], text: str, windows: list[tuple[int, int]]) -> Iterator[re.Match[str]]:
    for lo, hi in windows:
        yield from pattern.finditer(text, lo, hi)


def _hint(rule: Rule, value: str) -> str:
    shown = value[: rule.public_prefix]
    return f"{rule.name} ({shown + '…' if shown else ''}{len(value)} chars)"


def mask_secrets(text: str) -> str:
    """``text`` with every detected secret replaced by ``[REDACTED:<category>]`` (for excerpts)."""
    spans = sorted({(f.start, f.end, f.category) for f in find_secrets(text)})
    out, pos = [], 0
    for start, end, category in spans:
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(f"[REDACTED:{category}]")
        pos = end
    out.append(text[pos:])
    return "".join(out)


class SecretDetector:
    """The secrets classifier: one verdict per (item, category), with the best score found."""

    source = "secrets"

    def __init__(self, action: Action = "flag") -> None:
        self.action = action

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]:
        return self.scan(items)

    def scan(self, items: Sequence[ItemText]) -> list[Verdict]:
        """CPU only, no I/O: the composite may run it in a worker thread for large inputs."""
        verdicts: list[Verdict] = []
        for it in items:
            best: dict[str, Finding] = {}
            for f in find_secrets(it.text):
                if f.category not in best or f.score > best[f.category].score:
                    best[f.category] = f
            for f in best.values():
                verdicts.append(
                    Verdict(
                        self.action, f.category, f.score, it.index, it.item_id, f.rule, self.source, f.label, f.hint
                    )
                )
        return verdicts
