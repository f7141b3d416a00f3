"""The Files API on the wire: the objects returned, the list query, the upload's form fields and
the errors, shaped as the openai SDK's types (``openai.types.FileObject``, ``FileDeleted``).

A file of another tenant, like an unknown one, is a 404 naming only the id the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from cache.files.catalog import FileRecord
from gateway.wire.errors import ApiError, bad_request, unknown_parameter
from gateway.wire.items import new_id
from gateway.wire.listing import list_object

#: purposes a file may be uploaded for here: what ``file_search`` reads. Batch, fine-tuning, vision
#: and evals files are for APIs the gateway does not serve
PURPOSES = ("assistants", "user_data")
#: OpenAI's list bounds for files
DEFAULT_LIST_LIMIT = 10_000
MAX_LIST_LIMIT = 10_000
#: ``expires_after[seconds]`` bounds (an hour to 30 days, as OpenAI's)
MIN_EXPIRY_S = 3600
MAX_EXPIRY_S = 30 * 24 * 3600
#: the form fields an upload may carry
FORM_FIELDS = ("file", "purpose", "expires_after[anchor]", "expires_after[seconds]")


def new_file_id() -> str:
    """``file-`` and 48 hex digits (OpenAI's ids start ``file-``)."""
    return "file-" + new_id("f")[2:]


def file_object(record: FileRecord) -> dict[str, Any]:
    """``FileObject``: every field the SDK declares (``status`` ``processed``: the bytes are whole)."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": record.expires_at,
        "status_details": None,
    }


def file_list(records: list[FileRecord], has_more: bool) -> dict[str, Any]:
    return list_object([file_object(r) for r in records], has_more)


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}


def file_not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", code="file_not_found", param="id")


class FileListQuery(NamedTuple):
    after: str | None
    limit: int
    order: Literal["asc", "desc"]
    purpose: str | None


def parse_file_list_query(query: Mapping[str, str]) -> FileListQuery:
    """``after``, ``limit`` (1..10,000, default 10,000), ``order`` (default ``desc``), ``purpose``;
    any other parameter is a 400 naming it."""
    for key in query:
        if key not in ("after", "limit", "order", "purpose"):
            raise unknown_parameter(key)
    raw_limit = query.get("limit", str(DEFAULT_LIST_LIMIT))
    if not raw_limit.isdigit():
        raise bad_request("Invalid type for 'limit': expected an integer.", code="invalid_type", param="limit")
    limit = int(raw_limit)
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad_request(
            f"Invalid 'limit': expected a value between 1 and {MAX_LIST_LIMIT}, but got {limit} instead.",
            code="invalid_value",
            param="limit",
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(
            f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", code="invalid_value", param="order"
        )
    return FileListQuery(query.get("after"), limit, "asc" if order == "asc" else "desc", query.get("purpose"))


def check_purpose(purpose: str | None) -> str:
    if purpose is None:
        raise bad_request("Missing required parameter: 'purpose'.", code="missing_required_parameter", param="purpose")
    if purpose not in PURPOSES:
        raise bad_request(
            f"Invalid value for 'purpose': {purpose[:64]!r}. This server takes files for "
            f"{' and '.join(repr(p) for p in PURPOSES)} (file_search); other purposes are for APIs it does not serve.",
            code="invalid_value",
            param="purpose",
        )
    return purpose


def expiry_seconds(anchor: str | None, seconds: str | None) -> int | None:
    """``expires_after``: anchor ``created_at`` and 3,600..2,592,000 seconds, or neither."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise bad_request(
            "Invalid value for 'expires_after[anchor]': expected 'created_at'.",
            code="invalid_value",
            param="expires_after.anchor",
        )
    if seconds is None or not seconds.isdigit() or not MIN_EXPIRY_S <= int(seconds) <= MAX_EXPIRY_S:
        raise bad_request(
            f"Invalid value for 'expires_after[seconds]': expected an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}.",
            code="invalid_value",
            param="expires_after.seconds",
        )
    return int(seconds)


def file_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The file is larger than this server takes ({limit} bytes; setting files_max_bytes).",
        code="file_too_large",
        param="file",
    )


def quota_exceeded(what: str, limit: int) -> ApiError:
    unit = "files" if what == "files" else "bytes of files"
    setting = "files_per_tenant" if what == "files" else "files_bytes_per_tenant"
    return ApiError(
        400,
        f"This tenant already holds the {limit} {unit} it may (setting {setting}). Delete files to make room.",
        code="quota_exceeded",
        param="file",
    )


def unsupported_file(message: str) -> ApiError:
    """A file of a type the extractor does not read (``message`` names the type): refused at upload,
    nothing kept."""
    return ApiError(400, message, code="unsupported_file", param="file")
