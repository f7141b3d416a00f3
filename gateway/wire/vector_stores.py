"""The Vector Stores API on the wire: request bodies (strict: an unknown key is a 400 naming it),
the objects returned and the errors, shaped as the openai SDK's types (``openai.types.VectorStore``,
``vector_stores.VectorStoreFile``, ``VectorStoreFileBatch``, ``VectorStoreSearchResponse``).

A store, file or batch of another tenant, like an unknown one, is a 404 naming only the id sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cache.files.index import AttributeValue
from cache.files.store_catalog import BatchRecord, FileCounts, StoreFileRecord, StoreRecord
from gateway.wire.errors import ApiError
from gateway.wire.request import check_metadata

#: OpenAI's bounds on a file's attributes
MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY = 64
MAX_ATTRIBUTE_STRING = 512
#: files one create, attach or batch may name
MAX_FILE_IDS = 500
#: ``max_num_results`` of a search
MAX_SEARCH_RESULTS = 50
#: characters of a search query (a list's items together)
MAX_QUERY_CHARS = 4096
#: OpenAI's default chunking (``auto``) and the bounds of ``static``
AUTO_CHUNK_TOKENS = 800
AUTO_OVERLAP_TOKENS = 400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StaticChunking(_Strict):
    max_chunk_size_tokens: int = Field(ge=100, le=4096)
    chunk_overlap_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _overlap(self) -> StaticChunking:
        if self.chunk_overlap_tokens > self.max_chunk_size_tokens // 2:
            raise ValueError("'chunk_overlap_tokens' must not exceed half of 'max_chunk_size_tokens'.")
        return self


class ChunkingStrategy(_Strict):
    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    @model_validator(mode="after")
    def _shape(self) -> ChunkingStrategy:
        if self.type == "static" and self.static is None:
            raise ValueError("A 'static' chunking strategy needs its 'static' object.")
        if self.type == "auto" and self.static is not None:
            raise ValueError("An 'auto' chunking strategy takes no 'static' object.")
        return self

    def sizes(self) -> tuple[int, int]:
        """(max tokens per chunk, overlap tokens)."""
        if self.static is None:
            return AUTO_CHUNK_TOKENS, AUTO_OVERLAP_TOKENS
        return self.static.max_chunk_size_tokens, self.static.chunk_overlap_tokens

    def echo(self) -> dict[str, Any]:
        """As a vector store file carries it: ``auto`` is reported as the static sizes it stands for."""
        size, overlap = self.sizes()
        return {"type": "static", "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}}


AUTO = ChunkingStrategy(type="auto")


def check_attributes(v: dict[str, Any] | None) -> dict[str, AttributeValue] | None:
    """At most 16 keys of at most 64 characters; strings of at most 512 characters, numbers, booleans."""
    if v is None:
        return v
    if len(v) > MAX_ATTRIBUTES:
        raise ValueError(f"Invalid 'attributes': at most {MAX_ATTRIBUTES} keys.")
    for k, val in v.items():
        if not k or len(k) > MAX_ATTRIBUTE_KEY:
            raise ValueError(f"Invalid 'attributes': keys are 1 to {MAX_ATTRIBUTE_KEY} characters.")
        if isinstance(val, str):
            if len(val) > MAX_ATTRIBUTE_STRING:
                raise ValueError(f"Invalid 'attributes': strings are at most {MAX_ATTRIBUTE_STRING} characters.")
        elif not isinstance(val, bool | int | float) or (isinstance(val, float) and val != val):
            raise ValueError("Invalid 'attributes': values are strings, numbers or booleans.")
    return v


class ExpiresAfter(_Strict):
    anchor: Literal["last_active_at"]
    days: int = Field(ge=1, le=365)


class CreateStoreBody(_Strict):
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=512)
    metadata: dict[str, str] | None = None
    expires_after: ExpiresAfter | None = None
    file_ids: list[str] | None = Field(default=None, max_length=MAX_FILE_IDS)
    chunking_strategy: ChunkingStrategy | None = None

    _metadata = field_validator("metadata")(check_metadata)


class UpdateStoreBody(_Strict):
    name: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    expires_after: ExpiresAfter | None = None

    _metadata = field_validator("metadata")(check_metadata)


class AttachFileBody(_Strict):
    file_id: str = Field(max_length=128)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _attributes = field_validator("attributes")(check_attributes)


class UpdateFileBody(_Strict):
    attributes: dict[str, Any] | None

    _attributes = field_validator("attributes")(check_attributes)


class BatchFile(_Strict):
    file_id: str = Field(max_length=128)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _attributes = field_validator("attributes")(check_attributes)


class CreateBatchBody(_Strict):
    file_ids: list[str] | None = Field(default=None, max_length=MAX_FILE_IDS)
    files: list[BatchFile] | None = Field(default=None, max_length=MAX_FILE_IDS)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _attributes = field_validator("attributes")(check_attributes)

    @model_validator(mode="after")
    def _one_list(self) -> CreateBatchBody:
        if (self.file_ids is None) == (self.files is None):
            raise ValueError("Give either 'file_ids' or 'files' (one of them, not both).")
        return self


class HybridSearch(_Strict):
    embedding_weight: float = Field(ge=0)
    text_weight: float = Field(ge=0)


class RankingOptions(_Strict):
    ranker: Literal["none", "auto", "default-2024-11-15"] | None = None
    score_threshold: float | None = Field(default=None, ge=0, le=1)
    hybrid_search: HybridSearch | None = None


class SearchBody(_Strict):
    query: str | list[str]
    filters: dict[str, Any] | None = None
    max_num_results: int = Field(default=10, ge=1, le=MAX_SEARCH_RESULTS)
    ranking_options: RankingOptions | None = None
    #: accepted and not done: the query is searched as written (documented)
    rewrite_query: bool | None = None

    @field_validator("query")
    @classmethod
    def _bounded(cls, v: str | list[str]) -> str | list[str]:
        total = len(v) if isinstance(v, str) else sum(len(q) for q in v)
        if total > MAX_QUERY_CHARS:
            raise ValueError(f"'query' is at most {MAX_QUERY_CHARS} characters.")
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("'query' is at most 16 strings.")
        return v

    def text(self) -> str:
        return self.query if isinstance(self.query, str) else "\n".join(self.query)


# -- objects ---------------------------------------------------------------------------------------------


def _counts(counts: FileCounts) -> dict[str, int]:
    return {
        "in_progress": counts.in_progress,
        "completed": counts.completed,
        "failed": counts.failed,
        "cancelled": counts.cancelled,
        "total": counts.total,
    }


def store_object(record: StoreRecord, counts: FileCounts, usage_bytes: int, now: int) -> dict[str, Any]:
    expired = record.expires_at is not None and record.expires_at <= now
    return {
        "id": record.id,
        "object": "vector_store",
        "created_at": record.created_at,
        "name": record.name,
        "usage_bytes": usage_bytes,
        "file_counts": _counts(counts),
        "status": "expired" if expired else "in_progress" if counts.in_progress else "completed",
        "expires_after": (
            {"anchor": "last_active_at", "days": record.expires_after_days}
            if record.expires_after_days is not None
            else None
        ),
        "expires_at": record.expires_at,
        "last_active_at": record.last_active_at,
        "metadata": dict(record.metadata),
    }


def store_file_object(record: StoreFileRecord) -> dict[str, Any]:
    return {
        "id": record.file_id,
        "object": "vector_store.file",
        "created_at": record.created_at,
        "vector_store_id": record.store_id,
        "status": record.status,
        "usage_bytes": record.usage_bytes,
        "last_error": (
            {"code": record.last_error_code, "message": record.last_error_message or ""}
            if record.last_error_code is not None
            else None
        ),
        "attributes": dict(record.attributes),
        "chunking_strategy": dict(record.chunking) or None,
    }


def batch_object(record: BatchRecord, counts: FileCounts) -> dict[str, Any]:
    status = (
        "cancelled"
        if record.cancelled
        else "in_progress"
        if counts.in_progress
        else "failed"
        if counts.failed and not counts.completed
        else "completed"
    )
    return {
        "id": record.id,
        "object": "vector_store.files_batch",
        "created_at": record.created_at,
        "vector_store_id": record.store_id,
        "status": status,
        "file_counts": _counts(counts),
    }


def search_page(query: str | list[str], results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "object": "vector_store.search_results.page",
        "search_query": query if isinstance(query, list) else [query],
        "data": results,
        "has_more": False,
        "next_page": None,
    }


def search_result(
    file_id: str, filename: str, score: float, text: str, attributes: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "file_id": file_id,
        "filename": filename,
        "score": score,
        "attributes": dict(attributes),
        "content": [{"type": "text", "text": text}],
    }


def deleted(object_id: str, kind: str) -> dict[str, Any]:
    return {"id": object_id, "object": f"{kind}.deleted", "deleted": True}


def store_not_found(store_id: str) -> ApiError:
    return ApiError(404, f"No vector store found with id '{store_id}'.", code="vector_store_not_found", param="id")


def store_file_not_found(store_id: str, file_id: str) -> ApiError:
    return ApiError(
        404, f"No file found with id '{file_id}' in vector store '{store_id}'.", code="file_not_found", param="file_id"
    )


def batch_not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No file batch found with id '{batch_id}'.", code="batch_not_found", param="batch_id")
