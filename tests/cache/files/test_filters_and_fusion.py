"""``cache.files.index``: OpenAI's attribute filters (parsed with bounds, their reference meaning)
and the fusion every backend's candidates go through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from cache.files.index import (
    MAX_FILTER_DEPTH,
    Candidate,
    Comparison,
    Compound,
    FilterError,
    SearchMode,
    SearchQuery,
    matches,
    parse_filter,
    search,
)

ATTRS = {"team": "infra", "year": 2024, "draft": False, "score": 0.5}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"type": "eq", "key": "team", "value": "infra"}, True),
        ({"type": "eq", "key": "year", "value": "2024"}, False),  # a string is not a number
        ({"type": "eq", "key": "draft", "value": 0}, False),  # a boolean is not a number
        ({"type": "ne", "key": "missing", "value": "x"}, True),
        ({"type": "eq", "key": "missing", "value": "x"}, False),
        ({"type": "gte", "key": "year", "value": 2024}, True),
        ({"type": "lt", "key": "score", "value": 0.5}, False),
        ({"type": "gt", "key": "team", "value": 1}, False),  # an order comparison needs a number
        ({"type": "in", "key": "team", "value": ["web", "infra"]}, True),
        ({"type": "nin", "key": "missing", "value": ["x"]}, True),
        (
            {
                "type": "and",
                "filters": [
                    {"type": "eq", "key": "draft", "value": False},
                    {"type": "gt", "key": "year", "value": 2000},
                ],
            },
            True,
        ),
        (
            {
                "type": "or",
                "filters": [
                    {"type": "eq", "key": "team", "value": "web"},
                    {"type": "lt", "key": "year", "value": 2000},
                ],
            },
            False,
        ),
    ],
)
def test_filters_mean_what_openai_documents(raw: dict[str, Any], expected: bool) -> None:
    assert matches(parse_filter(raw), ATTRS) is expected


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ("team", "filters"),
        ({"type": "like", "key": "a", "value": 1}, "filters.type"),
        ({"type": "eq", "key": "", "value": 1}, "filters.key"),
        ({"type": "eq", "key": "k" * 65, "value": 1}, "filters.key"),
        ({"type": "eq", "key": "a", "value": {"x": 1}}, "filters.value"),
        ({"type": "eq", "key": "a", "value": float("nan")}, "filters.value"),
        ({"type": "gt", "key": "a", "value": "2024"}, "filters.value"),
        ({"type": "in", "key": "a", "value": list(range(257))}, "filters.value"),
        ({"type": "and", "filters": []}, "filters.filters"),
        ({"type": "or", "filters": [{"type": "eq", "key": "a"}]}, "filters.filters[0].value"),
    ],
)
def test_bad_filters_name_where(raw: Any, param: str) -> None:
    with pytest.raises(FilterError) as caught:
        parse_filter(raw)
    assert caught.value.param == param


def test_filters_are_bounded_in_depth_and_size() -> None:
    deep: dict[str, Any] = {"type": "eq", "key": "a", "value": 1}
    for _ in range(MAX_FILTER_DEPTH):
        deep = {"type": "and", "filters": [deep]}
    with pytest.raises(FilterError, match="nest"):
        parse_filter(deep)
    wide = {"type": "or", "filters": [{"type": "eq", "key": "a", "value": i} for i in range(100)]}
    with pytest.raises(FilterError, match="at most"):
        parse_filter(wide)
    assert parse_filter({"type": "and", "filters": [{"type": "eq", "key": "a", "value": 1}]}) == Compound(
        "and", (Comparison("eq", "a", 1),)
    )


class _Lists:
    """An index whose two sides answer fixed lists (the fusion alone under test)."""

    dims = 2

    def __init__(self, vector: Sequence[str], keyword: Sequence[str]) -> None:
        self.lists = {"v": vector, "k": keyword}

    def _cands(self, side: str, n: int) -> list[Candidate]:
        names = self.lists[side][:n]
        return [Candidate("vs", name, 0, name, {}, 1.0 - i / 10) for i, name in enumerate(names)]

    async def nearest(self, tenant: str, store_ids: Any, vector: Any, n: int, flt: Any) -> list[Candidate]:
        return self._cands("v", n)

    async def keyword(self, tenant: str, store_ids: Any, text: str, n: int, flt: Any) -> list[Candidate]:
        return self._cands("k", n)


async def _run(index: Any, **kw: Any) -> list[tuple[str, float]]:
    q = SearchQuery(store_ids=("vs",), text="q", vector=np.zeros(2, np.float32), **kw)
    return [(h.file_id, h.score) for h in await search(index, "t", q)]


async def test_fusion_prefers_what_both_sides_found() -> None:
    index = _Lists(vector=["a", "b", "c"], keyword=["c", "d", "a"])
    hits = await _run(index, max_results=4)
    assert [f for f, _ in hits] == ["a", "c", "b", "d"]
    assert all(0 < s <= 1 for _, s in hits) and hits[0][1] < 1  # first in both would be 1
    assert [f for f, _ in await _run(_Lists(["x"], ["x"]))] == ["x"] and (await _run(_Lists(["x"], ["x"])))[0][1] == 1


async def test_one_sided_modes_and_weights_and_threshold() -> None:
    index = _Lists(vector=["a", "b"], keyword=["c", "b"])
    assert [f for f, _ in await _run(index, mode=SearchMode.VECTOR)] == ["a", "b"]
    assert [f for f, _ in await _run(index, mode=SearchMode.KEYWORD)] == ["c", "b"]
    assert [f for f, _ in await _run(index, text_weight=0.0)] == ["a", "b"]
    assert (await _run(index, mode=SearchMode.VECTOR))[0][1] == 1.0  # its own similarity
    assert [f for f, _ in await _run(index, mode=SearchMode.VECTOR, score_threshold=0.95)] == ["a"]
    assert await _run(index, max_results=0) == []
