"""Uploaded documents to text and the text to chunks (issue 33's Files / Vector Stores / file_search).

``extract`` reads a file (text, Markdown, HTML, PDF, source code, JSON) into text under bounds;
``chunk_text`` cuts the text into token windows (``chunking_strategy``) with character offsets
back into it, so a citation can point at its source.
"""

from gateway.tools.documents.chunking import (
    AUTO_CHUNK_TOKENS,
    AUTO_OVERLAP_TOKENS,
    Chunk,
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
)

__all__ = [
    "AUTO_CHUNK_TOKENS",
    "AUTO_OVERLAP_TOKENS",
    "Chunk",
    "DocumentError",
    "Extracted",
    "ExtractionFailed",
    "Limits",
    "UnsupportedFile",
    "chunk_text",
    "count_tokens",
    "extract",
    "kind_for",
    "sizes_for",
]
