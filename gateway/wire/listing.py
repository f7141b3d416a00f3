"""The query of a cursor-paginated list: one parser for every list the gateway serves.

A response's input items (``GET /v1/responses/{id}/input_items``) and a conversation's items
(``GET /v1/conversations/{id}/items``) take the same ``after`` / ``limit`` / ``order`` /
``include[]`` parameters in OpenAI's API, so one parser answers both: a client gets the same 400 for
the same mistake on either. ``before`` is accepted only where the endpoint has it (input items:
earlier openai SDK releases declare it); elsewhere it is an unknown parameter, as OpenAI answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ValidationError

from gateway.wire.errors import bad_request, unknown_parameter
from gateway.wire.request import IncludeValue
from gateway.wire.validation import to_api_error

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
INCLUDE_KEYS = ("include", "include[]")
_PARAMS = frozenset({"after", "limit", "order", *INCLUDE_KEYS})


class ListQuery(NamedTuple):
    after: str | None
    before: str | None
    limit: int
    order: Literal["asc", "desc"]
    include: tuple[str, ...]


def parse_list_query(query: Mapping[str, str], multi: Sequence[tuple[str, str]], *, before: bool = False) -> ListQuery:
    """``after``, ``limit`` (1..100, default 20), ``order`` (default ``desc``), ``include`` (each
    value one of the Responses API's includables), and ``before`` where the endpoint has it; any
    other parameter is a 400 naming it."""
    allowed = _PARAMS | {"before"} if before else _PARAMS
    for key in query:
        if key not in allowed:
            raise unknown_parameter(key)
    try:
        limit = int(query.get("limit", str(DEFAULT_LIMIT)))
    except ValueError:
        raise bad_request(
            "Invalid type for 'limit': expected an integer.", code="invalid_type", param="limit"
        ) from None
    if not 1 <= limit <= MAX_LIMIT:
        raise bad_request(
            f"Invalid 'limit': expected a value between 1 and {MAX_LIMIT}, but got {limit} instead.",
            code="invalid_value",
            param="limit",
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(
            f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", code="invalid_value", param="order"
        )
    include = include_values(multi)
    return ListQuery(query.get("after"), query.get("before"), limit, "asc" if order == "asc" else "desc", include)


def include_values(multi: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The query's ``include`` / ``include[]`` values, checked (400 naming ``include[i]``)."""
    values = [v for k, v in multi if k in INCLUDE_KEYS]
    check_include(values)
    return tuple(values)


def check_include(values: list[str]) -> None:
    """``include`` values are checked; items are kept as they were produced, so none changes them."""
    try:
        _Includes.model_validate({"include": values})
    except ValidationError as exc:
        raise to_api_error(exc) from None


class _Includes(BaseModel):
    include: list[IncludeValue]


def cursor_page(items: Sequence[Mapping[str, Any]], q: ListQuery) -> tuple[list[Mapping[str, Any]], bool]:
    """One page of ``items`` (held oldest first) as ``q`` asks: in ``q.order``, strictly between the
    ``after`` and ``before`` cursors (item ids; an id not in the list is a 400 naming its cursor).
    With ``before`` alone the page is the ``limit`` items next to it (the previous page); the flag
    says whether more lie beyond the page on its far side."""
    ordered = list(items) if q.order == "asc" else list(reversed(items))
    ids = [i.get("id") for i in ordered]
    start, end = 0, len(ordered)
    if q.after is not None:
        start = _position(ids, q.after, "after") + 1
    if q.before is not None:
        end = _position(ids, q.before, "before")
    window = ordered[start:end] if start < end else []
    if q.before is not None and q.after is None:
        return window[-q.limit :], len(window) > q.limit
    return window[: q.limit], len(window) > q.limit


def _position(ids: list[Any], cursor: str, param: str) -> int:
    if cursor not in ids:
        raise bad_request(f"Item with id '{cursor}' not found.", code="invalid_value", param=param)
    return ids.index(cursor)


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page as every list of the API returns it: ``data`` with ``first_id`` / ``last_id``
    (the cursors the next request passes as ``after`` / ``before``) and ``has_more``."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
