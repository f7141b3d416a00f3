"""Pydantic validation errors -> OpenAI's error codes and wording.

OpenAI answers a bad field with a specific code (``invalid_type``, ``integer_below_min_value``,
``unknown_parameter`` ...) and a ``param`` path like ``input[0].content``. Clients (Codex above
all) branch on those, so the mapping is explicit here instead of leaking pydantic's messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import orjson
from pydantic import ValidationError

from gateway.wire.errors import ApiError, missing_parameter, unknown_parameter
from inference.item_types import ItemType, ToolType

_TYPE_NAMES = {
    "int": "an integer",
    "float": "a number with a decimal point",
    "str": "a string",
    "string": "a string",
    "bool": "a boolean",
    "dict": "an object",
    "list": "an array",
    "model": "an object",
    "NoneType": "null",
}


#: default bound on JSON nesting (setting ``max_json_depth``): far under what any serializer here can
#: write back (orjson writes 255 levels) or a renderer recurses through, above any real schema
MAX_JSON_DEPTH = 64


class InputRejected(ApiError):
    """A body or frame refused by a bound before any work; ``reason`` labels the rejection counter
    (``respgate_input_rejections_total{reason}``: size, depth, count, ...)."""

    def __init__(self, reason: str, status: int, message: str, **kwargs: Any) -> None:
        super().__init__(status, message, **kwargs)
        self.reason = reason


#: whether a parsed ``tools`` value is a list that passed these checks before (``gateway.turn.checks.
#: ToolChecks.known_for``): its nesting and schema sizes are not checked again
KnownTools = Callable[[Any], bool]


def decode_body(
    raw: bytes | str,
    *,
    max_depth: int,
    max_items: int,
    max_tools: int,
    max_schema_bytes: int | None = None,
    known_tools: KnownTools | None = None,
) -> Any:
    """Parse an HTTP body and check that it is an object, its nesting and its counts (CPU only: a
    big one is decoded in the prepare pool, ``gateway.turn.offload``).

    Every JSON endpoint takes an object; a string or an array is refused here, at the root, so no
    stage after it (the weighing that picks inline or pool preparation, the routes) ever sees one
    (issue 28 item 12: a long one reached ``PrepareOffload.for_body`` and was a 500)."""
    body = decode_json(raw, max_depth, known_tools)
    if not isinstance(body, dict):
        raise not_an_object(body)
    check_counts(
        body, max_items=max_items, max_tools=max_tools, max_schema_bytes=max_schema_bytes, known_tools=known_tools
    )
    return body


def not_an_object(value: Any) -> InputRejected:
    """The 400 for a body that parsed but is not a JSON object (counted as reason ``type``)."""
    return InputRejected(
        "type",
        400,
        f"Invalid type for the request body: expected an object, but got {json_type(value)} instead.",
        code="invalid_type",
        param="body",
    )


def decode_json(raw: bytes | str, max_depth: int, known_tools: KnownTools | None = None) -> Any:
    """Parse and check nesting: the 400 for a document too deep is the same whether orjson refused it
    (over 1,024 levels) or check_depth did (see :func:`parse_failure`)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise parse_failure(raw, exc, max_depth) from None
    # A document cannot nest deeper than it has opening brackets (those inside strings count too):
    # a short frame — every agent continuation — is cleared by two scans in C instead of a walk.
    opens = raw.count("{") + raw.count("[") if isinstance(raw, str) else raw.count(b"{") + raw.count(b"[")
    if opens > max_depth:
        # a coding agent's frame has hundreds of containers, nearly all in the tools it re-sends
        if known_tools is not None and isinstance(body, dict) and known_tools(body.get("tools")):
            _check_depth_but_tools(body, max_depth)
        else:
            check_depth(body, max_depth)
    return body


def _check_depth_but_tools(body: dict[str, Any], limit: int) -> None:
    """:func:`check_depth` of ``body`` without its ``tools`` (checked when they were first offered):
    the rest is walked as check_depth walks it once it opened the body, without copying the body."""
    _check_depth_of(
        [(value, 2, key) for key, value in body.items() if key != "tools" and isinstance(value, (dict, list))], limit
    )


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """400 when ``value`` (a parsed JSON body or frame) nests deeper than ``limit`` containers.

    Checked before any other work: a deeply nested ``tools[].parameters``, ``text.format`` schema or
    ``tool_choice`` would otherwise reach code that recurses (serializers, renderers, grammar
    builders) and fail there as a 500. Iterative and containers only, so the check itself is bounded
    by the body's size, never by the interpreter's stack."""
    _check_depth_of([(value, 1, "")], limit)


def _check_depth_of(stack: list[tuple[Any, int, str]], limit: int) -> None:
    """The walk: ``stack`` holds (container, its depth, the top-level parameter it is under)."""
    while stack:
        node, depth, top = stack.pop()
        if depth > limit:
            param = top or "body"
            raise InputRejected(
                "depth",
                400,
                f"Invalid '{param}': JSON nested deeper than {limit} levels.",
                code="invalid_value",
                param=param,
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if isinstance(child, (dict, list)):
                    stack.append((child, depth + 1, top or str(key)))
        elif isinstance(node, list):
            for child in node:
                if isinstance(child, (dict, list)):
                    stack.append((child, depth + 1, top))


def check_counts(
    body: Any,
    *,
    max_items: int,
    max_tools: int,
    max_schema_bytes: int | None = None,
    known_tools: KnownTools | None = None,
) -> None:
    """400 when a create-shaped body lists more input items or tools than allowed, or carries a
    schema (a tool's ``parameters``, a custom tool's grammar, ``text.format.schema``) larger than
    ``max_schema_bytes`` serialized: checked on the parsed JSON, before validation, so an
    allowed-but-huge request costs its parse, not seconds of validation, classification, rendering
    and grammar compilation (a structured-output grammar is compiled from the schema)."""
    if not isinstance(body, dict):
        return
    for key, limit in (("input", max_items), ("tools", max_tools)):
        value = body.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise InputRejected(
                "count",
                400,
                f"Invalid '{key}': array too long. Expected an array with maximum "
                f"length {limit}, but got an array with length {len(value)} instead.",
                code="array_above_max_length",
                param=key,
            )
    if max_schema_bytes is not None and ("tools" in body or "text" in body):  # where schemas are
        skip_tools = known_tools is not None and known_tools(body.get("tools"))
        for param, schema in _schemas(body, skip_tools):
            size = len(schema.encode()) if isinstance(schema, str) else len(orjson.dumps(schema))
            if size > max_schema_bytes:
                raise InputRejected(
                    "schema",
                    400,
                    f"Invalid '{param}': schema too large ({size} bytes; the limit is {max_schema_bytes}).",
                    code="invalid_value",
                    param=param,
                )


def _schemas(body: dict[str, Any], skip_tools: bool = False) -> Iterator[tuple[str, Any]]:
    """(param path, schema) of every schema-like value a create carries (but its tools' when
    ``skip_tools``: a list that passed these checks before)."""
    tools = body.get("tools")
    if isinstance(tools, list) and not skip_tools:
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                continue
            subs = tool.get("tools") if tool.get("type") == "namespace" else None
            pairs = [(f"tools[{i}]", tool)] + (
                [(f"tools[{i}].tools[{j}]", t) for j, t in enumerate(subs) if isinstance(t, dict)]
                if isinstance(subs, list)
                else []
            )
            for path, t in pairs:
                if t.get("parameters") is not None:
                    yield f"{path}.parameters", t["parameters"]
                fmt = t.get("format")
                if isinstance(fmt, dict) and fmt.get("definition") is not None:
                    yield f"{path}.format.definition", fmt["definition"]
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("schema") is not None:
        yield "text.format.schema", fmt["schema"]


def param_path(loc: tuple[Any, ...]) -> str:
    """The client's path of a pydantic error location (``input[0].content``). A discriminated
    union's tag is a step of the location, not of the path: left out — but a location's first and
    last steps are always fields (``text``, a create's field, is also a tag's name)."""
    out = ""
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith("<") or (part in _UNION_TAGS and 0 < i < last)):
            continue  # discriminated-union tags are not part of the client's path
        else:
            out += f".{part}" if out else str(part)
    return out


_UNION_TAGS = frozenset(
    {
        *ItemType,
        *ToolType,
        "input_text",
        "input_image",
        "input_file",
        "output_text",
        "refusal",
        "json_schema",
        "json_object",
        "text",
        "mcp",
    }
)


def json_type(value: Any) -> str:
    """How an error message names a JSON value's type ("an object", "a string", ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return type(value).__name__


def _expected(err_type: str) -> str:
    base = err_type.split("_")[0]
    return _TYPE_NAMES.get(base, f"a valid {base}")


class _BoundSide(NamedTuple):
    """One side of a numeric bound as OpenAI words its refusal: pydantic's ``ctx`` keys for the
    bound (inclusive first), and the words of the message and code. One table for both sides,
    so that the minimum's and the maximum's answers cannot drift apart."""

    inclusive: str
    exclusive: str
    word: str
    end: str
    op: str


_BELOW = _BoundSide("ge", "gt", "below", "minimum", ">=")
_ABOVE = _BoundSide("le", "lt", "above", "maximum", "<=")
#: pydantic's bound error types -> the side they refuse
_BOUND_SIDES = {
    "greater_than_equal": _BELOW,
    "greater_than": _BELOW,
    "less_than_equal": _ABOVE,
    "less_than": _ABOVE,
}


def to_api_error(exc: ValidationError) -> ApiError:
    """The first error decides (OpenAI also reports one problem at a time)."""
    errors = exc.errors(include_url=False)
    # Prefer the most specific error: unknown params and missing params first, then deepest path.
    errors.sort(key=lambda e: (e["type"] not in ("extra_forbidden", "missing"), -len(e["loc"])))
    e = errors[0]
    param = param_path(tuple(e["loc"]))
    t = e["type"]
    value = e.get("input")
    ctx = e.get("ctx") or {}
    if t == "extra_forbidden":
        return unknown_parameter(param)
    if t == "missing":
        return missing_parameter(param)
    if (
        t.endswith("_type")
        or t.endswith("_parsing")
        or t in ("model_type", "model_attributes_type", "list_type", "dict_type", "union_tag_not_found")
    ):
        return ApiError(
            400,
            f"Invalid type for '{param}': expected {_expected(t)}, but got {json_type(value)} instead.",
            code="invalid_type",
            param=param,
        )
    side = _BOUND_SIDES.get(t)
    if side is not None:
        bound = ctx.get(side.inclusive, ctx.get(side.exclusive))
        kind = "integer" if isinstance(value, int) else "decimal"
        return ApiError(
            400,
            f"Invalid '{param}': {kind} {side.word} {side.end} value. "
            f"Expected a value {side.op} {bound}, but got {value} instead.",
            code=f"{kind}_{side.word}_{side.end[:3]}_value",
            param=param,
        )
    if t in ("literal_error", "enum", "union_tag_invalid"):
        expected = ctx.get("expected") or ctx.get("expected_tags") or ""
        shown = value.get("type") if isinstance(value, dict) else value
        return ApiError(
            400, f"Invalid value: '{shown}'. Supported values are: {expected}.", code="invalid_value", param=param
        )
    if t in ("string_too_long", "too_long"):
        return ApiError(
            400,
            f"Invalid '{param}': {e['msg']}.",
            code="string_above_max_length" if t == "string_too_long" else "array_above_max_length",
            param=param,
        )
    if t == "value_error":
        msg = str(ctx.get("error") or e["msg"])
        return ApiError(400, msg, code="invalid_value", param=param)
    return ApiError(400, f"Invalid '{param}': {e['msg']}.", code="invalid_value", param=param)


#: JSON strings and structural characters (the unrolled string pattern: no per-character alternation)
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')


def parse_failure(raw: bytes | str, exc: Exception, limit: int = MAX_JSON_DEPTH) -> ApiError:
    """The 400 for a body or frame that does not parse.

    orjson refuses documents nested deeper than 1,024 levels with its own "depth limit exceeded"
    (before check_depth could see them); that is still a depth refusal, so it gets the same answer
    as a shallower one — ``invalid_value`` naming the top-level parameter that holds the nesting,
    found by scanning the text up to the failure position (error path only, linear, iterative).
    Anything else is ``invalid_json``."""
    pos = getattr(exc, "pos", None)
    if "depth limit" not in str(exc) or not isinstance(pos, int):
        return ApiError(400, "We could not parse the JSON body of your request.", code="invalid_json")
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    depth, expect_key, top = 0, False, None
    for m in _JSON_TOKEN.finditer(text, 0, pos):
        tok = m.group()
        if tok in "{[":
            depth += 1
            expect_key = depth == 1 and tok == "{"
        elif tok in "}]":
            depth -= 1
        elif tok == ",":
            expect_key = depth == 1
        elif depth == 1 and expect_key:
            top, expect_key = tok[1:-1], False
    param = top or "body"
    return InputRejected(
        "depth", 400, f"Invalid '{param}': JSON nested deeper than {limit} levels.", code="invalid_value", param=param
    )
