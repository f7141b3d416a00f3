"""Conversation summaries for compaction, as plain items every renderer already understands.

Compaction replaces the history with a summary the model wrote itself. Two items carry it:

* the **request**: a user message asking for the summary, rendered *after* the conversation (so
  the engine's prefix cache reuses the whole history's KV and only this message is new);
* the **summary**: a developer message ``"Summary of the earlier conversation: ..."`` that stands
  in for the dropped items. A developer/system message mid-conversation is rendered natively by
  harmony and by chat templates (``developer`` becomes ``system`` where the template lacks it), so
  neither renderer family needs a new item type and the incremental contract is untouched.

The wording lives here, not in the gateway, because the simulated engine recognises the request
(:func:`is_summary_request`) to answer it deterministically, and ``inference`` never imports the
gateway. The gateway seals and unseals the summary text; renderers only ever see these dicts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SUMMARY_PREFIX", "SUMMARY_REQUEST", "is_summary_request", "summary_message", "summary_request"]

#: first words of the summary request (the simulated engine keys on them)
SUMMARY_REQUEST = "[context compaction] Summarize the conversation above"

_REQUEST_TEXT = (
    SUMMARY_REQUEST + " so that you can continue it later without the original messages. Keep the user's "
    "goals and requests, decisions made, important facts, names, values and file paths, tool results that "
    "still matter, and what remains to be done. Write only the summary, as concise plain text."
)

#: how the summary introduces itself where it replaces the history
SUMMARY_PREFIX = "Summary of the earlier conversation (older messages were compacted into it):\n"


def summary_request() -> dict[str, Any]:
    """The user message that asks the model for the summary (never kept in any history)."""
    return {
        "type": "message",
        "role": "user",
        "id": "msg_compaction_request",
        "status": "completed",
        "content": [{"type": "input_text", "text": _REQUEST_TEXT}],
    }


def is_summary_request(text: str) -> bool:
    return text.lstrip().startswith(SUMMARY_REQUEST)


def summary_message(summary: str, item_id: str) -> dict[str, Any]:
    """The item that stands for everything the summary replaced."""
    return {
        "type": "message",
        "role": "developer",
        "id": item_id,
        "status": "completed",
        "content": [{"type": "input_text", "text": SUMMARY_PREFIX + summary}],
    }
