"""An operator's own content policy: regex patterns with an action and a category, plus size limits.

Loaded from a JSON file (``RESPGATE_CLASSIFIER_POLICY_FILE``)::

    {
      "max_item_bytes": 1048576,          # one item's classified text; over it -> block (or "size_action")
      "max_items_per_turn": 256,          # new items in one request; over it -> block
      "size_action": "block",
      "patterns": [
        {"name": "internal-host", "regex": "\\\\b[a-z0-9-]+\\\\.corp\\\\.example\\\\b", "flags": "i",
         "action": "flag", "category": "internal_hostname", "applies_to": ["user", "tool_output"]}
      ]
    }

``applies_to`` narrows a pattern to items of some kinds: ``user`` (user/system/developer messages),
``assistant`` (assistant messages, reasoning, tool calls), ``tool_output``; absent = every item.
The file is validated at start-up (a bad regex or action stops the gateway with a clear message
rather than silently allowing everything). Categories are reported as ``policy:<category>``;
the match itself is never returned, only the pattern's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from security.classifiers import ItemText, Verdict

Applies = Literal["user", "assistant", "tool_output"]


class PatternRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    regex: str
    flags: str = ""
    action: Literal["flag", "block"] = "flag"
    category: str = "custom"
    applies_to: list[Applies] | None = None
    score: float = Field(1.0, ge=0.0, le=1.0)

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: str) -> str:
        if set(v) - set("imsx"):
            raise ValueError("flags may only contain i, m, s, x")
        return v

    def compiled(self) -> re.Pattern[str]:
        flags = 0
        for ch, f in (("i", re.I), ("m", re.M), ("s", re.S), ("x", re.X)):
            if ch in self.flags:
                flags |= f
        try:
            return re.compile(self.regex, flags)
        except re.error as exc:
            raise ValueError(f"policy pattern '{self.name}': invalid regex: {exc}") from None


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_item_bytes: int | None = Field(None, gt=0)
    max_items_per_turn: int | None = Field(None, gt=0)
    size_action: Literal["flag", "block"] = "block"
    patterns: list[PatternRule] = Field(default_factory=list)

    @classmethod
    def load(cls, path: str) -> PolicyConfig:
        try:
            with open(path, "rb") as f:
                raw: Any = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read classifier policy file {path}: {exc}") from None
        return cls.model_validate(raw)


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: PatternRule
    pattern: re.Pattern[str]


def _kind(it: ItemText) -> Applies:
    if it.tool_output:
        return "tool_output"
    if it.type == "message" and it.role != "assistant":
        return "user"
    return "assistant"


class PolicyClassifier:
    source = "policy"

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rules = [_Compiled(r, r.compiled()) for r in config.patterns]

    @classmethod
    def from_file(cls, path: str) -> PolicyClassifier:
        return cls(PolicyConfig.load(path))

    async def classify(self, items: Sequence[ItemText]) -> list[Verdict]:
        return self.scan(items)

    def scan(self, items: Sequence[ItemText]) -> list[Verdict]:
        """CPU only, no I/O: the composite may run it in a worker thread for large inputs."""
        c = self.config
        verdicts: list[Verdict] = []
        if c.max_items_per_turn is not None and len(items) > c.max_items_per_turn:
            verdicts.append(
                Verdict(
                    c.size_action,
                    "policy:too_many_items",
                    1.0,
                    None,
                    None,
                    "max_items_per_turn",
                    self.source,
                    f"more than {c.max_items_per_turn} new input items",
                    f"{len(items)} items",
                )
            )
        for it in items:
            if c.max_item_bytes is not None and it.nbytes > c.max_item_bytes:
                verdicts.append(
                    Verdict(
                        c.size_action,
                        "policy:item_too_large",
                        1.0,
                        it.index,
                        it.item_id,
                        "max_item_bytes",
                        self.source,
                        f"an item larger than {c.max_item_bytes} bytes",
                        f"{it.nbytes} bytes",
                    )
                )
                if c.size_action == "block":
                    continue  # do not run patterns over an item that is refused for its size
            kind = _kind(it)
            for r in self.rules:
                if r.rule.applies_to is not None and kind not in r.rule.applies_to:
                    continue
                if r.pattern.search(it.text):
                    verdicts.append(
                        Verdict(
                            r.rule.action,
                            f"policy:{r.rule.category}",
                            r.rule.score,
                            it.index,
                            it.item_id,
                            r.rule.name,
                            self.source,
                            f"content matching policy rule '{r.rule.name}'",
                            None,
                        )
                    )
        return verdicts
