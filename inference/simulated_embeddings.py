"""A simulated embedding model, as ``inference.simulated`` is a simulated LLM: deterministic,
instant, no weights — for the fast tests of everything around the vectors (the Files and Vector
Stores APIs, ingestion, ``file_search``'s events and citations). The real model
(``inference.embeddings``) is what deployments run and what the slow tests and benchmarks measure.

Its vectors are hashed bags of words and character trigrams, L2-normalised: texts sharing words
score higher, so a search for a document's words finds it, which is all these tests need. It
knows nothing of meaning (a paraphrase with no shared word scores near zero).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Literal

import numpy as np
import regex

__all__ = ["SimulatedEmbedder"]

_WORD = regex.compile(r"\w+")


class SimulatedEmbedder:
    name = "simulated-embeddings"

    def __init__(self, dims: int = 384, max_tokens: int = 256) -> None:
        self.dims = dims
        self.max_tokens = max_tokens
        #: texts embedded, for tests that count the work
        self.embedded = 0

    def _vector(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dims, np.float32)
        words = _WORD.findall(text.lower())[: self.max_tokens]
        features = words + [w[i : i + 3] for w in words for i in range(max(1, len(w) - 2))]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dims
            vec[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm else vec

    async def embed(self, texts: Sequence[str], kind: Literal["document", "query"] = "document") -> np.ndarray:
        self.embedded += len(texts)
        await asyncio.sleep(0)
        if not texts:
            return np.zeros((0, self.dims), np.float32)
        return np.stack([self._vector(t) for t in texts])
