"""A ``multipart/form-data`` upload read as it streams in: small named fields kept (bounded), one
file part's bytes handed on piece by piece to a sink as they arrive.

Why not Starlette's ``request.form()``: it spools every file part to a temporary file with no cap
on its size, and only then does the route see it — a 2 GB upload would cost 2 GB of disk before it
could be refused. Here python-multipart's push parser (the one Starlette uses) is fed each chunk of
the paced body (``http_routes.paced_body``) and the file's bytes go straight to the sink, which
refuses as soon as they pass its cap. The parser's callbacks are synchronous, so each chunk's
events are collected and then acted on, awaiting the sink: memory stays at one chunk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header
from starlette.requests import Request

from gateway.transport.http_routes import paced_body
from gateway.transport.services import GatewayState
from gateway.wire.errors import ApiError, bad_request, unknown_parameter

__all__ = ["UploadForm", "read_upload_form"]

#: bytes of one text field (``purpose``, ``expires_after[seconds]``): far more than any needs
MAX_FIELD_BYTES = 1024
#: parts of one form
MAX_PARTS = 16


@dataclass
class UploadForm:
    """The form as read: its text fields and the file part's name and declared type."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    content_type: str | None = None
    file_seen: bool = False


def _malformed(detail: str) -> ApiError:
    return bad_request(f"The multipart/form-data body is malformed: {detail}", code="invalid_multipart")


async def read_upload_form(
    request: Request,
    gw: GatewayState,
    sink: Callable[[bytes], Awaitable[None]],
    *,
    file_field: str,
    fields: Sequence[str],
    form: UploadForm | None = None,
) -> UploadForm:
    """Read the body as a form: ``file_field``'s bytes to ``sink`` as they arrive, the ``fields``
    kept; any other part is a 400 naming it, as is a second file or a field over
    :data:`MAX_FIELD_BYTES`. Raises what the sink raises (its cap) as soon as it does. ``form``:
    filled in as the parts arrive (the sink may look at the file's name and type), else a new one."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise bad_request(
            "An upload is a multipart/form-data body (with a boundary).", code="invalid_content_type", param="file"
        )
    encoding = [v.strip().lower() for v in request.headers.getlist("content-encoding")]
    if any(v not in ("", "identity") for v in encoding):
        raise ApiError(
            415,
            "An upload's body is not content-encoded (send the file as it is).",
            code="unsupported_content_encoding",
        )
    form = form if form is not None else UploadForm()
    events: list[tuple[str, Any]] = []
    header: dict[str, bytearray] = {"name": bytearray(), "value": bytearray()}
    headers: dict[bytes, bytes] = {}

    def header_field(data: bytes, start: int, end: int) -> None:
        header["name"] += data[start:end]

    def header_value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def header_end() -> None:
        headers[bytes(header["name"]).lower()] = bytes(header["value"])
        header["name"], header["value"] = bytearray(), bytearray()

    def headers_finished() -> None:
        events.append(("start", dict(headers)))
        headers.clear()

    def part_data(data: bytes, start: int, end: int) -> None:
        events.append(("data", bytes(data[start:end])))

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": header_field,
            "on_header_value": header_value,
            "on_header_end": header_end,
            "on_headers_finished": headers_finished,
            "on_part_data": part_data,
            "on_part_end": lambda: events.append(("end", None)),
        },
    )
    current: str | None = None
    value = bytearray()
    parts = 0
    ended = True
    async for chunk in paced_body(request, gw):
        try:
            parser.write(chunk)
        except MultipartParseError as exc:
            raise _malformed(str(exc)) from None
        batch, events[:] = list(events), []
        for event, payload in batch:
            if event == "start":
                parts += 1
                if parts > MAX_PARTS:
                    raise _malformed(f"more than {MAX_PARTS} parts")
                _, disposition = parse_options_header(payload.get(b"content-disposition", b""))
                name = disposition.get(b"name", b"").decode("utf-8", "replace")
                if name == file_field:
                    if form.file_seen:
                        raise bad_request("Send one file per upload.", code="invalid_value", param=file_field)
                    form.file_seen = True
                    filename = disposition.get(b"filename")
                    form.filename = filename.decode("utf-8", "replace") if filename is not None else None
                    ctype = payload.get(b"content-type")
                    form.content_type = ctype.decode("latin-1")[:200] if ctype else None
                elif name not in fields:
                    raise unknown_parameter(name[:64] or "(a part without a name)")
                elif name in form.fields:
                    raise bad_request(f"'{name}' is given twice.", code="invalid_value", param=name)
                current, value, ended = name, bytearray(), False
            elif event == "data":
                if current == file_field:
                    await sink(payload)
                else:
                    value += payload
                    if len(value) > MAX_FIELD_BYTES:
                        raise bad_request(f"'{current}' is too long.", code="invalid_value", param=current)
            else:
                if current is not None and current != file_field:
                    form.fields[current] = value.decode("utf-8", "replace")
                current, ended = None, True
    try:
        parser.finalize()
    except MultipartParseError as exc:
        raise _malformed(str(exc)) from None
    if not ended or parts == 0:
        raise _malformed("the body ends inside a part, or has none")
    return form
