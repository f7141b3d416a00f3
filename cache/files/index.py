"""The chunk index behind ``file_search`` and ``POST /v1/vector_stores/{id}/search``: one interface,
two backends (embedded SQLite; Postgres with pgvector for several replicas), one search code.

Why this split: ranking must be the same whichever backend holds the chunks, or a deployment that
moves to Postgres would answer differently. So a backend does only what needs its storage —
keep chunks with their vectors and attributes, return the nearest ``n`` by cosine similarity and
the best ``n`` by keyword relevance (BM25 or the backend's equivalent), each under an attribute
filter — and :func:`search` (here) fuses the two candidate lists the same way for both.

Everything is per tenant: every call names the tenant, and a backend never returns or touches a
chunk of another tenant, whatever the ids say (ids are not secrets).

Fusion is weighted reciprocal rank fusion (RRF, k=60): rank-based, so cosine similarities and
BM25 scores need no common scale. Each hit's ``score`` is its fused value over the best a chunk
could get (first in both lists), a number in [0, 1] that ``score_threshold`` compares with; with
one side's weight 0 it is that side's ranking alone (``mode`` ``vector`` / ``keyword`` in the
benchmarks), scored by the side's own similarity in [0, 1].
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard

import numpy as np

__all__ = [
    "AttributeValue",
    "Candidate",
    "ChunkIndex",
    "Comparison",
    "Compound",
    "Filter",
    "Hit",
    "NewChunk",
    "SearchMode",
    "SearchQuery",
    "matches",
    "parse_filter",
    "search",
]

#: what an attribute holds (OpenAI: up to 16 keys; strings up to 512 characters, numbers, booleans)
AttributeValue = str | int | float | bool

#: RRF's constant: how much a first place outweighs a tenth
RRF_K = 60


class SearchMode(enum.StrEnum):
    """Which rankings a search fuses (``hybrid`` everywhere but in benchmarks and ``ranker: none``)."""

    HYBRID = "hybrid"
    VECTOR = "vector"
    KEYWORD = "keyword"


@dataclass(frozen=True, slots=True)
class NewChunk:
    """One chunk of a file as ingestion made it: its position, its text, where it came from in the
    file's extracted text (for citations), its token count (for usage), its vector (float32,
    L2-normalised, the index's ``dims``)."""

    index: int
    text: str
    start: int
    end: int
    tokens: int
    vector: np.ndarray


@dataclass(frozen=True, slots=True)
class Candidate:
    """A chunk one side of the search found: ``similarity`` in [0, 1] (cosine clamped, or the
    keyword score normalised by the backend over its own candidates)."""

    store_id: str
    file_id: str
    index: int
    text: str
    attributes: Mapping[str, AttributeValue]
    similarity: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.store_id, self.file_id, self.index)


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the chunk and its fused score in [0, 1]."""

    store_id: str
    file_id: str
    index: int
    text: str
    attributes: Mapping[str, AttributeValue]
    score: float


# -- attribute filters (OpenAI's ComparisonFilter / CompoundFilter) ------------------------------------

ComparisonOp = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """``{"type": op, "key": ..., "value": ...}``; ``in``/``nin`` take a list of scalars."""

    op: ComparisonOp
    key: str
    value: AttributeValue | tuple[AttributeValue, ...]


@dataclass(frozen=True, slots=True)
class Compound:
    """``{"type": "and" | "or", "filters": [...]}``."""

    op: Literal["and", "or"]
    filters: tuple[Filter, ...]


Filter = Comparison | Compound

#: bounds on a filter a request sends: nesting and total nodes (a backend compiles it to SQL)
MAX_FILTER_DEPTH = 8
MAX_FILTER_NODES = 64
MAX_IN_VALUES = 256


class FilterError(ValueError):
    """A filter that is not OpenAI's shape or exceeds the bounds; ``param`` names where."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def parse_filter(raw: Any, param: str = "filters") -> Filter:
    """A request's ``filters`` as the typed tree, checked against the bounds (:class:`FilterError`)."""
    nodes = 0

    def walk(node: Any, where: str, depth: int) -> Filter:
        nonlocal nodes
        nodes += 1
        if nodes > MAX_FILTER_NODES:
            raise FilterError(f"a filter may have at most {MAX_FILTER_NODES} conditions", param)
        if depth > MAX_FILTER_DEPTH:
            raise FilterError(f"filters may nest at most {MAX_FILTER_DEPTH} deep", where)
        if not isinstance(node, Mapping):
            raise FilterError("a filter is an object with a 'type'", where)
        kind = node.get("type")
        if kind in ("and", "or"):
            subs = node.get("filters")
            if not isinstance(subs, list) or not subs:
                raise FilterError(f"an '{kind}' filter needs a non-empty 'filters' list", f"{where}.filters")
            return Compound(kind, tuple(walk(s, f"{where}.filters[{i}]", depth + 1) for i, s in enumerate(subs)))
        if kind not in ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"):
            raise FilterError(f"unknown filter type {kind!r}", f"{where}.type")
        key = node.get("key")
        if not isinstance(key, str) or not key or len(key) > 64:
            raise FilterError("a comparison needs a 'key' of 1 to 64 characters", f"{where}.key")
        value = node.get("value")
        if kind in ("in", "nin"):
            if not isinstance(value, list) or len(value) > MAX_IN_VALUES or not all(_scalar(v) for v in value):
                raise FilterError(f"'{kind}' takes a list of at most {MAX_IN_VALUES} scalars", f"{where}.value")
            return Comparison(kind, key, tuple(value))
        if not _scalar(value):
            raise FilterError("a comparison's 'value' is a string, number or boolean", f"{where}.value")
        if kind in ("gt", "gte", "lt", "lte") and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise FilterError(f"'{kind}' compares numbers", f"{where}.value")
        return Comparison(kind, key, value)

    return walk(raw, param, 1)


def _scalar(value: Any) -> TypeGuard[AttributeValue]:
    return isinstance(value, str | bool | int | float) and not (isinstance(value, float) and value != value)


def matches(flt: Filter | None, attributes: Mapping[str, AttributeValue]) -> bool:
    """The reference meaning of a filter, which every backend's compiled form must agree with: a
    missing key fails every comparison but ``ne`` and ``nin``; ``eq``/``ne``/``in`` compare type and
    value (``1`` is not ``"1"``, ``True`` is not ``1``); an order comparison needs a number."""
    if flt is None:
        return True
    if isinstance(flt, Compound):
        results = (matches(f, attributes) for f in flt.filters)
        return all(results) if flt.op == "and" else any(results)
    present = flt.key in attributes
    have = attributes.get(flt.key)
    if flt.op in ("eq", "ne"):
        equal = present and _same(have, flt.value)
        return equal if flt.op == "eq" else not equal
    if flt.op in ("in", "nin"):
        assert isinstance(flt.value, tuple)
        inside = present and any(_same(have, v) for v in flt.value)
        return inside if flt.op == "in" else not inside
    if not present or isinstance(have, bool) or not isinstance(have, int | float):
        return False
    bound = flt.value
    assert isinstance(bound, int | float)
    return {"gt": have > bound, "gte": have >= bound, "lt": have < bound, "lte": have <= bound}[flt.op]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


# -- the backend interface -----------------------------------------------------------------------------


class ChunkIndex(Protocol):
    """Chunks with vectors and attributes, per tenant and vector store. Writes are whole files: a
    file's chunks are added together and removed together (re-ingesting replaces them)."""

    dims: int

    async def add(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        chunks: Sequence[NewChunk],
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        """Add a file's chunks (replacing any the file already had in that store)."""
        ...

    async def set_attributes(
        self, tenant: str, store_id: str, file_id: str, attributes: Mapping[str, AttributeValue]
    ) -> None:
        """Replace the attributes a file's chunks are filtered by."""
        ...

    async def remove_file(self, tenant: str, store_id: str | None, file_id: str) -> int:
        """Remove a file's chunks from one store (``None``: from every store); the count removed."""
        ...

    async def remove_store(self, tenant: str, store_id: str) -> int:
        """Remove every chunk of a store; the count removed."""
        ...

    async def nearest(
        self, tenant: str, store_ids: Sequence[str], vector: np.ndarray, n: int, flt: Filter | None
    ) -> list[Candidate]:
        """The ``n`` chunks most similar to ``vector`` (cosine, best first) among the filter's."""
        ...

    async def keyword(
        self, tenant: str, store_ids: Sequence[str], text: str, n: int, flt: Filter | None
    ) -> list[Candidate]:
        """The ``n`` chunks best matching ``text`` by keywords (best first) among the filter's."""
        ...

    async def count(self, tenant: str, store_id: str | None = None) -> int:
        """Chunks a tenant holds (in one store, or in all): for quotas."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """One search: the stores, the query's text and vector, how many hits, the filter, the ranking
    options (``ranking_options``: ``score_threshold``, ``hybrid_search`` weights)."""

    store_ids: tuple[str, ...]
    text: str
    vector: np.ndarray
    max_results: int = 10
    flt: Filter | None = None
    score_threshold: float = 0.0
    embedding_weight: float = 1.0
    text_weight: float = 1.0
    mode: SearchMode = SearchMode.HYBRID
    #: candidates each side returns before fusion, per hit asked for (at least ``min_candidates``)
    depth: int = 4
    min_candidates: int = 40


async def search(index: ChunkIndex, tenant: str, query: SearchQuery) -> list[Hit]:
    """The hits of ``query`` in ``tenant``'s stores, best first: both sides' candidates fused by
    weighted RRF (see the module docstring), then the threshold and the count applied."""
    if not query.store_ids or query.max_results <= 0:
        return []
    n = max(query.max_results * query.depth, query.min_candidates)
    w_vec = query.embedding_weight if query.mode is not SearchMode.KEYWORD else 0.0
    w_key = query.text_weight if query.mode is not SearchMode.VECTOR else 0.0
    sides: list[tuple[float, list[Candidate]]] = []
    if w_vec > 0:
        sides.append((w_vec, await index.nearest(tenant, query.store_ids, query.vector, n, query.flt)))
    if w_key > 0 and query.text.strip():
        sides.append((w_key, await index.keyword(tenant, query.store_ids, query.text, n, query.flt)))
    if not sides:
        return []
    if len(sides) == 1:  # one ranking: its own similarity is the score
        ranked = [(c.similarity, c) for c in sides[0][1]]
    else:
        best = sum(w for w, _ in sides) / (RRF_K + 1)
        fused: dict[tuple[str, str, int], list[Any]] = {}
        for weight, candidates in sides:
            for rank, c in enumerate(candidates):
                entry = fused.setdefault(c.key, [0.0, c])
                entry[0] += weight / (RRF_K + 1 + rank)
        ranked = [(score / best, c) for score, c in fused.values()]
    ranked.sort(key=lambda sc: (-sc[0], sc[1].key))
    return [
        Hit(c.store_id, c.file_id, c.index, c.text, c.attributes, round(min(1.0, max(0.0, s)), 6))
        for s, c in ranked
        if s >= query.score_threshold
    ][: query.max_results]
