"""Bearer-key check shared by HTTP routes and the WebSocket handshake.

With no keys configured any bearer (or none) is accepted and the tenant is ``None``; with a static
key list, a missing or unknown key is ``401 invalid_api_key``. The tenant of a key is a digest of it,
so stores never hold raw keys. The security issue replaces this with hashed keys and tenants.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Mapping

from gateway.errors import invalid_api_key


class KeyAuth:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant(self, headers: Mapping[str, str]) -> str | None:
        """Returns the caller's tenant id or raises ``ApiError(401)``."""
        if not self._keys:
            return None
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise invalid_api_key()
        supplied = token.strip().encode()
        for key in self._keys:
            if hmac.compare_digest(supplied, key):
                return "t_" + hashlib.sha256(key).hexdigest()[:24]
        raise invalid_api_key()
