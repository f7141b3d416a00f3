"""What every :class:`cache.files.index.ChunkIndex` must do, whatever holds the chunks.

A backend's test module subclasses :class:`ChunkIndexConformance` and provides an ``index``
fixture (an open, empty index; any ``dims`` of at least 8): pytest then runs every check below on
it. The checks use fresh random tenant ids, so an index may be shared between checks (and between
the examples of the hypothesis one) as long as no one else writes those tenants.

What is checked: tenants are isolated byte for byte (the same store and file ids in two tenants
never mix, in reads, removals or counts); filters select exactly what :func:`matches` says, on
random attributes; removal and counting; re-adding a file replaces its chunks; ``nearest`` is
cosine order; ``keyword`` finds identifiers as written and ranks by BM25-like relevance;
``store_ids`` restrict; unicode and query text that is FTS syntax (or 1 MB of it) never raises.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache.files.index import (
    AttributeValue,
    Candidate,
    ChunkIndex,
    Comparison,
    Compound,
    Filter,
    NewChunk,
    SearchQuery,
    matches,
    parse_filter,
    search,
)

__all__ = ["ATTRIBUTES", "FILTERS", "HOSTILE_QUERIES", "ChunkIndexConformance", "chunks_of", "unit"]

#: query texts that are FTS5 / tsquery syntax, or odd, and must be read as plain words
HOSTILE_QUERIES = [
    '"',
    '""',
    '"unterminated phrase',
    "NEAR(alpha beta, 2)",
    "alpha NEAR beta",
    "alp*",
    "*",
    "-alpha",
    "alpha -beta",
    "NOT alpha",
    "alpha AND OR NOT",
    "(alpha OR (beta",
    ")",
    "text: alpha",
    "{alpha beta}: gamma",
    "^alpha",
    "alpha + beta",
    "col:alpha",
    "a & b | !c <-> d",
    "'; DROP TABLE chunks; --",
    "\x00 alpha \x00",
    "\u200b\u200d\ufeff",
    "🦜🦜 emoji ✓",
    "日本語のテキスト",
    "naïve café Ωmega",
    "   ",
    "_",
    "__init__",
    "a" * 10_000,
]

_KEYS = ("team", "year", "draft", "score", "tag")
_SCALARS = st.one_of(
    st.sampled_from(["infra", "web", "", "1", "true", "Ωmega", 'q"uote']),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.0, 0.5, -1.5, 2.0, 1e6]),
    st.booleans(),
)
#: attributes as OpenAI allows them, from a few keys and values so filters hit and miss
ATTRIBUTES = st.dictionaries(st.sampled_from(_KEYS), _SCALARS, max_size=len(_KEYS))


def _comparison() -> st.SearchStrategy[Filter]:
    keys = st.sampled_from((*_KEYS, "missing", 'we"ird.key'))
    numbers = st.one_of(st.integers(min_value=-3, max_value=3), st.sampled_from([0.0, 0.5, -1.5, 2.0]))
    return st.one_of(
        st.builds(Comparison, st.sampled_from(["eq", "ne"]), keys, _SCALARS),
        st.builds(Comparison, st.sampled_from(["gt", "gte", "lt", "lte"]), keys, numbers),
        st.builds(
            Comparison,
            st.sampled_from(["in", "nin"]),
            keys,
            st.lists(_SCALARS, max_size=4).map(tuple),
        ),
    )


#: filter trees up to three levels deep
FILTERS: st.SearchStrategy[Filter] = st.recursive(
    _comparison(),
    lambda inner: st.builds(
        Compound, st.sampled_from(["and", "or"]), st.lists(inner, min_size=1, max_size=3).map(tuple)
    ),
    max_leaves=6,
)


#: every example uses fresh tenants, so one index (a function-scoped fixture, a subclass each) is safe
_SHARED_INDEX = [HealthCheck.function_scoped_fixture, HealthCheck.differing_executors]


def unit(vector: Sequence[float] | np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    return v / np.linalg.norm(v)


def chunks_of(texts: Sequence[str], vectors: Sequence[np.ndarray]) -> list[NewChunk]:
    return [
        NewChunk(index=i, text=t, start=0, end=len(t), tokens=len(t.split()), vector=v)
        for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
    ]


def _tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:12]}"


def _rng_vectors(rng: np.random.Generator, count: int, dims: int) -> list[np.ndarray]:
    return [unit(rng.standard_normal(dims)) for _ in range(count)]


def _keys(candidates: Sequence[Candidate]) -> list[tuple[str, str, int]]:
    return [c.key for c in candidates]


def _snapshot(candidates: Sequence[Candidate]) -> list[tuple[Any, ...]]:
    return [(c.store_id, c.file_id, c.index, c.text, dict(c.attributes), c.similarity) for c in candidates]


class ChunkIndexConformance:
    """The checks; a subclass named ``Test...`` provides the ``index`` fixture."""

    @pytest.fixture
    def index(self) -> ChunkIndex:  # pragma: no cover - the subclass provides it
        raise NotImplementedError

    # -- tenancy -------------------------------------------------------------------------------

    async def test_tenants_with_the_same_ids_never_mix(self, index: ChunkIndex) -> None:
        a, b = _tenant(), _tenant()
        rng = np.random.default_rng(1)
        va, vb = _rng_vectors(rng, 3, index.dims), _rng_vectors(rng, 3, index.dims)
        texts_a = ["alpha secret of tenant a", "shared words here", "tenant a only zebra"]
        texts_b = ["beta secret of tenant b", "shared words here", "tenant b only yak"]
        await index.add(a, "vs_1", "file_1", chunks_of(texts_a, va), {"owner": "a"})
        await index.add(b, "vs_1", "file_1", chunks_of(texts_b, vb), {"owner": "b"})

        async def view(tenant: str) -> list[Any]:
            near = await index.nearest(tenant, ["vs_1"], va[0], 50, None)
            words = await index.keyword(tenant, ["vs_1"], "secret shared tenant zebra yak", 50, None)
            return [_snapshot(near), _snapshot(words), await index.count(tenant), await index.count(tenant, "vs_1")]

        before = await view(a)
        seen_by_b = await view(b)
        for part in seen_by_b[:2]:
            assert part, "tenant b finds its own chunks"
            assert all(row[4] == {"owner": "b"} and "tenant a" not in row[3] for row in part)
        assert not await index.keyword(b, ["vs_1"], "zebra", 50, None)

        # tenant b removes and rewrites everything under the same ids: tenant a is unchanged
        await index.set_attributes(b, "vs_1", "file_1", {"owner": "b2"})
        assert await index.remove_file(b, "vs_1", "file_1") == 3
        await index.add(b, "vs_1", "file_1", chunks_of(texts_b[:1], vb[:1]), {"owner": "b"})
        assert await index.remove_file(b, None, "file_1") == 1
        assert await index.remove_store(b, "vs_1") == 0
        assert await index.remove_file(b, "vs_1", "file_1") == 0
        assert await view(a) == before
        assert await index.count(b) == 0
        # and the other way round
        assert await index.remove_store(a, "vs_1") == 3
        assert await index.count(a) == 0

    # -- filters ----------------------------------------------------------------------------------

    @settings(max_examples=40, deadline=None, suppress_health_check=_SHARED_INDEX)
    @given(files=st.lists(ATTRIBUTES, min_size=1, max_size=10), filters=st.lists(FILTERS, min_size=1, max_size=4))
    async def test_filters_select_what_matches_says(
        self, index: ChunkIndex, files: list[dict[str, AttributeValue]], filters: list[Filter]
    ) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(len(files))
        for i, attrs in enumerate(files):
            texts = [f"common filtered words file{i} part{j}" for j in range(2)]
            await index.add(tenant, "vs_f", f"file_{i}", chunks_of(texts, _rng_vectors(rng, 2, index.dims)), attrs)
        probe = unit(rng.standard_normal(index.dims))
        for flt in filters:
            want = {("vs_f", f"file_{i}", j) for i, attrs in enumerate(files) if matches(flt, attrs) for j in range(2)}
            near = await index.nearest(tenant, ["vs_f"], probe, 100, flt)
            words = await index.keyword(tenant, ["vs_f"], "common", 100, flt)
            assert set(_keys(near)) == want, flt
            assert set(_keys(words)) == want, flt
            assert all(matches(flt, c.attributes) for c in near + words)
        await index.remove_store(tenant, "vs_f")

    async def test_a_selective_filter_loses_no_recall(self, index: ChunkIndex) -> None:
        """The one matching chunk among many closer ones is found: filtering happens before the
        ``n`` best are taken, not after."""
        tenant = _tenant()
        rng = np.random.default_rng(2)
        probe = unit(rng.standard_normal(index.dims))
        close = [unit(probe + 0.05 * rng.standard_normal(index.dims)) for _ in range(300)]
        far = unit(-probe + 0.05 * rng.standard_normal(index.dims))
        await index.add(tenant, "vs_r", "crowd", chunks_of([f"needle crowd {i}" for i in range(300)], close), {})
        await index.add(tenant, "vs_r", "rare", chunks_of(["needle rare"], [far]), {"kind": "rare"})
        flt = parse_filter({"type": "eq", "key": "kind", "value": "rare"})
        assert _keys(await index.nearest(tenant, ["vs_r"], probe, 5, flt)) == [("vs_r", "rare", 0)]
        assert _keys(await index.keyword(tenant, ["vs_r"], "needle", 5, flt)) == [("vs_r", "rare", 0)]

    async def test_set_attributes_changes_what_filters_select(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        vectors = _rng_vectors(np.random.default_rng(3), 2, index.dims)
        await index.add(tenant, "vs_a", "f", chunks_of(["one attr text", "two attr text"], vectors), {"v": 1})
        flt = parse_filter({"type": "eq", "key": "v", "value": 2})
        assert await index.keyword(tenant, ["vs_a"], "attr", 10, flt) == []
        await index.set_attributes(tenant, "vs_a", "f", {"v": 2})
        found = await index.keyword(tenant, ["vs_a"], "attr", 10, flt)
        assert sorted(_keys(found)) == [("vs_a", "f", 0), ("vs_a", "f", 1)]
        assert all(c.attributes == {"v": 2} for c in found)
        assert len(await index.nearest(tenant, ["vs_a"], vectors[0], 10, flt)) == 2

    # -- writes and counts ------------------------------------------------------------------------

    async def test_remove_file_remove_store_and_count(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(4)

        def five(word: str) -> list[NewChunk]:
            return chunks_of([f"{word} {i}" for i in range(5)], _rng_vectors(rng, 5, index.dims))

        await index.add(tenant, "vs_1", "f1", five("apple"), {})
        await index.add(tenant, "vs_1", "f2", five("pear"), {})
        await index.add(tenant, "vs_2", "f1", five("apple"), {})
        await index.add(tenant, "vs_2", "f3", five("plum"), {})
        assert (await index.count(tenant), await index.count(tenant, "vs_1"), await index.count(tenant, "vs_2")) == (
            20,
            10,
            10,
        )
        assert await index.count(tenant, "vs_none") == 0
        assert await index.remove_file(tenant, "vs_1", "f2") == 5
        assert await index.remove_file(tenant, "vs_1", "f2") == 0
        assert await index.count(tenant, "vs_1") == 5
        assert await index.remove_file(tenant, None, "f1") == 10  # from every store
        assert await index.keyword(tenant, ["vs_1", "vs_2"], "apple", 50, None) == []
        assert await index.count(tenant) == 5
        assert await index.remove_store(tenant, "vs_2") == 5
        assert await index.remove_store(tenant, "vs_2") == 0
        assert await index.count(tenant) == 0
        assert await index.nearest(tenant, ["vs_1", "vs_2"], unit(rng.standard_normal(index.dims)), 50, None) == []

    async def test_re_adding_a_file_replaces_its_chunks(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(5)
        old = _rng_vectors(rng, 3, index.dims)
        await index.add(tenant, "vs", "f", chunks_of(["oldword one", "oldword two", "oldword three"], old), {"v": 1})
        new = _rng_vectors(rng, 1, index.dims)
        await index.add(tenant, "vs", "f", chunks_of(["newword only"], new), {"v": 2})
        assert await index.count(tenant, "vs") == 1
        assert await index.keyword(tenant, ["vs"], "oldword", 10, None) == []
        found = await index.nearest(tenant, ["vs"], old[1], 10, None)
        assert [(c.key, c.text, dict(c.attributes)) for c in found] == [(("vs", "f", 0), "newword only", {"v": 2})]
        await index.add(tenant, "vs", "f", [], {})
        assert await index.count(tenant, "vs") == 0

    # -- ranking ----------------------------------------------------------------------------------

    async def test_nearest_is_cosine_order(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(6)
        vectors = _rng_vectors(rng, 60, index.dims)
        await index.add(tenant, "vs", "f", chunks_of([f"c{i}" for i in range(60)], vectors), {})
        probe = unit(rng.standard_normal(index.dims))
        cosines = np.array([float(v @ probe) for v in vectors])
        want = [int(i) for i in np.argsort(-cosines)[:10]]
        found = await index.nearest(tenant, ["vs"], probe, 10, None)
        assert [c.index for c in found] == want
        for c in found:
            assert c.similarity == pytest.approx(max(0.0, cosines[c.index]), abs=1e-4)
            assert 0.0 <= c.similarity <= 1.0
        # a query vector that is not unit length means the same direction
        assert [c.index for c in await index.nearest(tenant, ["vs"], probe * 7.5, 10, None)] == want
        assert await index.nearest(tenant, ["vs"], probe, 0, None) == []
        assert await index.nearest(tenant, [], probe, 10, None) == []

    async def test_keyword_finds_identifiers_as_written(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        texts = [
            "call get_user_by_id(42) to load the record",
            "the user may get an id by calling the service",  # the same words, not the identifier
            "retry after ERR-4021 from the payment gateway",
            "build wheels for x86_64 and aarch64",
            "the error code was 4021 and err was logged",
        ]
        await index.add(tenant, "vs", "f", chunks_of(texts, _rng_vectors(np.random.default_rng(7), 5, index.dims)), {})
        for query, best in [("get_user_by_id", 0), ("ERR-4021", 2), ("x86_64", 3), ("aarch64 wheels", 3)]:
            found = await index.keyword(tenant, ["vs"], query, 5, None)
            assert found and found[0].index == best, (query, _keys(found))
            assert found[0].similarity == pytest.approx(1.0)
            assert all(0.0 <= c.similarity <= 1.0 for c in found)
            assert [c.similarity for c in found] == sorted((c.similarity for c in found), reverse=True)

    async def test_keyword_ranks_by_relevance(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"
        texts = [
            f"common {filler}",  # 0: only the common word
            f"common zanzibar {filler}",  # 1: the rare word too
            "zanzibar zanzibar zanzibar common",  # 2: the rare word, often, in a short chunk
            *(f"common {filler} {i}" for i in range(20)),
        ]
        await index.add(tenant, "vs", "f", chunks_of(texts, _rng_vectors(np.random.default_rng(8), 23, index.dims)), {})
        found = await index.keyword(tenant, ["vs"], "zanzibar common", 30, None)
        assert [c.index for c in found[:2]] == [2, 1]
        assert len(found) == 23
        assert found[0].similarity > found[2].similarity

    async def test_store_ids_restrict(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(9)
        probe = unit(rng.standard_normal(index.dims))
        for store in ("vs_1", "vs_2", "vs_3"):
            await index.add(tenant, store, "f", chunks_of([f"word in {store}"] * 3, [probe] * 3), {})
        for stores in (["vs_1"], ["vs_2", "vs_3"], ["vs_3", "vs_3"]):
            near = await index.nearest(tenant, stores, probe, 50, None)
            words = await index.keyword(tenant, stores, "word", 50, None)
            assert {c.store_id for c in near} == set(stores) == {c.store_id for c in words}
            assert len(near) == len(words) == 3 * len(set(stores))
        assert await index.nearest(tenant, ["vs_none"], probe, 50, None) == []

    async def test_search_fuses_both_sides(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        rng = np.random.default_rng(10)
        vectors = _rng_vectors(rng, 8, index.dims)
        texts = [f"plain filler text number {i}" for i in range(8)]
        texts[5] = "the quokka is a small marsupial"
        await index.add(tenant, "vs", "f", chunks_of(texts, vectors), {})
        hits = await search(index, tenant, SearchQuery(("vs",), "quokka", vectors[5], max_results=3))
        assert hits[0].index == 5 and hits[0].score == pytest.approx(1.0)
        assert all(0.0 <= h.score <= 1.0 for h in hits)

    # -- hostile text ---------------------------------------------------------------------------

    @pytest.mark.parametrize("query", HOSTILE_QUERIES)
    async def test_query_text_is_never_syntax(self, index: ChunkIndex, query: str) -> None:
        tenant = _tenant()
        texts = ["alpha beta gamma", "NEAR the star * of (beta)", "naïve café Ωmega", "日本語のテキスト", "__init__"]
        await index.add(tenant, "vs", "f", chunks_of(texts, _rng_vectors(np.random.default_rng(11), 5, index.dims)), {})
        found = await index.keyword(tenant, ["vs"], query, 10, None)
        assert all(0.0 <= c.similarity <= 1.0 and c.store_id == "vs" for c in found)
        if query.startswith("naïve"):
            assert 2 in [c.index for c in found]

    @settings(max_examples=60, deadline=None, suppress_health_check=_SHARED_INDEX)
    @given(query=st.text(max_size=200))
    async def test_any_text_is_a_query(self, index: ChunkIndex, query: str) -> None:
        found = await index.keyword("tenant-nobody", ["vs"], query, 10, None)
        assert found == []

    async def test_a_megabyte_of_query_text(self, index: ChunkIndex) -> None:
        tenant = _tenant()
        vector = _rng_vectors(np.random.default_rng(12), 1, index.dims)
        await index.add(tenant, "vs", "f", chunks_of(["needle here"], vector), {})
        for query in ("needle " + "x" * 1_000_000, "needle " + '"NEAR(*) -a ' * 90_000, "needle " + "word " * 200_000):
            found = await index.keyword(tenant, ["vs"], query, 10, None)
            assert all(c.key == ("vs", "f", 0) for c in found)
        assert _keys(await index.keyword(tenant, ["vs"], "needle " + "x" * 1_000_000, 10, None)) == [("vs", "f", 0)]

    async def test_unicode_round_trips(self, index: ChunkIndex) -> None:
        tenant = "tenant-Ω-" + uuid.uuid4().hex[:6]
        text = "Ωmega ünïcödé 🦜 \u200b日本語 texte"
        attrs: Mapping[str, AttributeValue] = {"名前": "値", "emoji": "🦜", "n": 3}
        vector = _rng_vectors(np.random.default_rng(13), 1, index.dims)
        await index.add(tenant, "vs_ü", "file_🦜", chunks_of([text], vector), attrs)
        found = await index.keyword(tenant, ["vs_ü"], "ünïcödé", 5, None)
        want = [("vs_ü", "file_🦜", text, attrs)]
        assert [(c.store_id, c.file_id, c.text, dict(c.attributes)) for c in found] == want
        flt = parse_filter({"type": "eq", "key": "名前", "value": "値"})
        assert len(await index.keyword(tenant, ["vs_ü"], "texte", 5, flt)) == 1
