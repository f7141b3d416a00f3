"""The text of a message's content parts, as both renderers put it in a prompt.

Why one place: a content list mixes text parts, refusals and parts the model cannot read here
(images, files, audio); each renderer must show the model the same words for them — the text,
the refusal, or a placeholder such as ``[image]`` — or the two model families would see different
conversations for one request.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PLACEHOLDERS", "content_text", "content_texts", "part_text"]

#: what a part without text reads as (an unknown kind: ``[its type]``)
PLACEHOLDERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}


def part_text(part: Any) -> str:
    """One part's text: a string as is, a refusal's words, a part's ``text``, else its placeholder."""
    if isinstance(part, str):
        return part
    kind = part.get("type")
    if kind == "refusal":
        return str(part.get("refusal") or "")
    if part.get("text") is not None:
        return str(part["text"])
    return PLACEHOLDERS.get(kind, f"[{kind}]")


def content_texts(content: Any) -> list[str]:
    """Each part's text (``content`` None: none; a string: itself)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [part_text(p) for p in content]


def content_text(content: Any) -> str:
    """The parts' texts joined."""
    return "".join(content_texts(content))
