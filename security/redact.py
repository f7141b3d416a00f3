"""A logging filter that removes API keys from every log record before any handler sees it.

Keys reach logs by accident, not by design: a client puts its key in the wrong header, in a query
string or a URL path (access logs print paths), a library logs request headers at DEBUG
(``websockets`` does, ``Authorization`` included), or an exception message quotes the input that
failed. So the filter does not trust any call site: it formats each record's message (and its
traceback text) once, scrubs it, and stores the result back on the record.

What is scrubbed: anything shaped like one of our keys (``rg-<hint>-<secret>``), bearer
credentials (``Bearer <anything>``), ``authorization``/``api-key`` style header values in
``key: value`` or ``'key': 'value'`` form, OpenAI-style ``sk-...`` tokens, and any literal secret
configured on the gateway (static keys can have any shape).

``install`` puts the filter on the record factory, so it covers every logger and every handler —
including handlers added later (uvicorn configures its own at start-up).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

from security.keys import KEY_PATTERN

REDACTED = "[REDACTED]"

_PATTERNS = [
    KEY_PATTERN,
    re.compile(r"(?i)(bearer|basic|token)(\s+|%20|\+)(?!%)[^\s'\",;]+"),
    re.compile(
        r"(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|openai-api-key)(['\"]?\s*[:=,]\s*(?:b?['\"])?"
        r"(?:(?:bearer|basic|token)\s+)?)(?!%)[^\s'\",;&]+"
    ),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
]


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._secrets: list[str] = []
        self.add_secrets(secrets)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        with self._lock:
            merged = set(self._secrets) | {s for s in secrets if s and len(s) >= 4}
            self._secrets = sorted(merged, key=len, reverse=True)  # longest first: no partial leftovers

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for i, pattern in enumerate(_PATTERNS):
            if i == 0 or i == 3:
                text = pattern.sub(REDACTED, text)
            else:
                text = pattern.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
        return text

    def redact_format(self, fmt: str) -> str:
        """Like ``redact`` but leaves ``%s``-style placeholders alone (``"api_key=%s"`` stays a format)."""
        parts = re.split(r"(%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[a-zA-Z%])", fmt)
        return "".join(p if i % 2 else self.redact(p) for i, p in enumerate(parts))

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record, self)
        return True


def redact_record(record: logging.LogRecord, flt: RedactingFilter) -> None:
    """Scrub the record in place.

    The check runs on the fully formatted message, because a secret's context can be split across
    arguments (``"< %s: %s", "X-Api-Key", key``). When it is dirty, the format string and each
    argument are cleaned one by one if that yields a clean message — some formatters read
    ``record.args`` themselves (uvicorn's access formatter unpacks them) — else the message is
    replaced by its redacted text.
    """
    if getattr(record, "_redacted", False):
        return
    record._redacted = True
    try:
        message = record.getMessage()
    except Exception:  # a broken format string must not lose the record (nor leak through the error)
        message = f"{record.msg!r} % {record.args!r}"
        record.args = None
    cleaned = flt.redact(message)
    if cleaned != message:
        msg, args = flt.redact_format(str(record.msg)), record.args
        if isinstance(args, tuple):
            args = tuple(_clean(a, flt) for a in args)
        elif isinstance(args, dict):
            args = {k: _clean(v, flt) for k, v in args.items()}
        try:
            piecewise = msg % args if args else msg
        except Exception:
            piecewise = None
        if piecewise is not None and flt.redact(piecewise) == piecewise:
            record.msg, record.args = msg, args
        else:
            record.msg, record.args = cleaned, None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = flt.redact(record.exc_text)
    if record.stack_info:
        record.stack_info = flt.redact(record.stack_info)


def _clean(value: object, flt: RedactingFilter) -> object:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return flt.redact(value)
    text, shown = str(value), repr(value)
    if flt.redact(text) == text and flt.redact(shown) == shown:
        return value  # nothing secret: keep the object, so %r and %d still format it as before
    return flt.redact(text)


_installed: RedactingFilter | None = None


def install(secrets: Iterable[str] = ()) -> RedactingFilter:
    """Redact every record created from now on (idempotent; later calls add secrets)."""
    global _installed
    if _installed is not None:
        _installed.add_secrets(secrets)
        return _installed
    flt = RedactingFilter(secrets)
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record, flt)
        return record

    logging.setLogRecordFactory(factory)
    _installed = flt
    return flt
