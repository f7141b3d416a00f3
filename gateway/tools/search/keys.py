"""An API key from settings, checked once when the backend is configured.

A key is sent in one request header and kept nowhere else the gateway shows: configs keep it with
``repr=False``, backends' reprs omit it, and ``SearchFailed`` messages are never built from
anything that could hold it (``client.py``).
"""

from __future__ import annotations

import re

__all__ = ["check_api_key"]

_HEADER_SAFE = re.compile(r"[\x21-\x7e]{1,512}")


def check_api_key(key: str, what: str) -> None:
    """ValueError (naming ``what``, never the key) for an empty key or one that cannot be a header
    value: whitespace, control or non-ASCII characters, over 512 characters."""
    if not isinstance(key, str) or not _HEADER_SAFE.fullmatch(key):
        raise ValueError(f"{what}: an API key of 1-512 visible ASCII characters is required")
