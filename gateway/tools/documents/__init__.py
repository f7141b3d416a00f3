"""Uploaded documents to text and the text to chunks (issue 33's Files / Vector Stores / file_search).

``extract`` reads a file (text, Markdown, HTML, PDF, source code, JSON) into text under bounds;
``chunk_text`` cuts the text into token windows (``chunking_strategy``) with character offsets
back into it, so a citation can point at its source. ``extract_chunks`` does both for a stored
file. All of it is blocking CPU work (a PDF waits on its worker process): call it from a thread
(``asyncio.to_thread``), never on the event loop. ``UnsupportedFile`` is the API's
``unsupported_file``; ``ExtractionFailed.reason`` is a file's ``last_error``.
"""

from __future__ import annotations

import os

from gateway.tools.documents.chunking import (
    AUTO_CHUNK_TOKENS,
    AUTO_OVERLAP_TOKENS,
    Chunk,
    check_sizes,
    chunk_text,
    count_tokens,
    sizes_for,
)
from gateway.tools.documents.extract import (
    DocumentError,
    Extracted,
    ExtractionFailed,
    Limits,
    UnsupportedFile,
    extract,
    kind_for,
    readable_kind,
)


def extract_chunks(
    source: bytes | str | os.PathLike[str],
    filename: str,
    size: int = AUTO_CHUNK_TOKENS,
    overlap: int = AUTO_OVERLAP_TOKENS,
    content_type: str | None = None,
    limits: Limits | None = None,
) -> tuple[Extracted, list[Chunk]]:
    """A file's text and its chunks. Raises :class:`UnsupportedFile`, :class:`ExtractionFailed`
    (also for a file with no text at all), or ``ValueError`` for sizes out of range."""
    check_sizes(size, overlap)
    extracted = extract(source, filename, content_type, limits or Limits())
    if not extracted.text.strip():
        raise ExtractionFailed("The file holds no text.")
    return extracted, list(chunk_text(extracted.text, size, overlap))


__all__ = [
    "AUTO_CHUNK_TOKENS",
    "AUTO_OVERLAP_TOKENS",
    "Chunk",
    "DocumentError",
    "Extracted",
    "ExtractionFailed",
    "Limits",
    "UnsupportedFile",
    "check_sizes",
    "chunk_text",
    "count_tokens",
    "extract",
    "extract_chunks",
    "kind_for",
    "readable_kind",
    "sizes_for",
]
