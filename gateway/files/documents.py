"""Ingestion's first step as ``gateway.files.ingestion`` asks for it: a stored file to its chunks,
through the document extractor and chunker (``gateway.tools.documents``), off the event loop.

The extractor's two refusals become the file's ``last_error`` codes: a type it does not read is
``unsupported_file``, a file it could not read (malformed, too big, too slow) ``invalid_file``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.files.ingestion import Prepared, PrepareFailed
from gateway.tools.documents import ExtractionFailed, UnsupportedFile, chunk_text, extract

__all__ = ["file_text", "prepare_file"]


def _prepare(path: Path, filename: str, max_tokens: int, overlap_tokens: int) -> list[Prepared]:
    try:
        extracted = extract(path, filename)
    except UnsupportedFile as exc:
        raise PrepareFailed("unsupported_file", exc.message) from None
    except ExtractionFailed as exc:
        raise PrepareFailed("invalid_file", exc.message) from None
    return [Prepared(c.text, c.start, c.end, c.tokens) for c in chunk_text(extracted.text, max_tokens, overlap_tokens)]


async def prepare_file(path: Path, filename: str, max_tokens: int, overlap_tokens: int) -> list[Prepared]:
    """The file's chunks (:class:`PrepareFailed` when it cannot be read), in a worker thread: the
    extractor bounds its own time (a PDF is read in a child process with a deadline)."""
    return await asyncio.to_thread(_prepare, path, filename, max_tokens, overlap_tokens)


def _text(path: Path, filename: str) -> str:
    try:
        return extract(path, filename).text
    except UnsupportedFile as exc:
        raise PrepareFailed("unsupported_file", exc.message) from None
    except ExtractionFailed as exc:
        raise PrepareFailed("invalid_file", exc.message) from None


async def file_text(path: Path, filename: str) -> str:
    """The file's text as ingestion reads it (``GET /vector_stores/{id}/files/{file_id}/content``)."""
    return await asyncio.to_thread(_text, path, filename)
