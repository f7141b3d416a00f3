"""``file_search`` run by the gateway: the model searches the request's vector stores through a
``file_search`` namespace with one function, ``msearch(queries)``, and reads the best passages back
at the token tip, each headed by its citation mark ``【{call}:{n}†{filename}】`` (OpenAI's own
file-citation form); a mark the model copies into its answer becomes a ``file_citation``
annotation (``gateway.tools.citations``).

What the request's tool sets, and what happens to it:

* ``vector_store_ids``: the tenant's stores (another tenant's, or an unknown id: a 404 before the
  response exists); every query searches all of them.
* ``max_num_results`` (1..50, default 10): passages the model reads per call, the best of all its
  queries (a chunk two queries found counts once).
* ``filters``: OpenAI's attribute filter, applied inside the search (``cache.files.index``).
* ``ranking_options``: ``score_threshold``; ``hybrid_search`` weights of the vector and keyword
  sides; ``ranker`` ``auto`` and ``default-2024-11-15`` are the same hybrid ranking here.
* ``include: ["file_search_call.results"]``: the call's item lists what the model read.

What the model reads is the tenant's own data, but it is also text someone uploaded: it is
classified as new input like any tool output, and bounded (``tool_output_bytes``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cache.files.index import Filter, FilterError, parse_filter
from gateway.base.metrics import StageTimer
from gateway.files.vector_stores import SearchHit, VectorStores
from gateway.tools.calls import FILE_SEARCH, FILE_SEARCH_NAMESPACE, CallResult
from gateway.tools.citations import FileSource
from gateway.wire.errors import bad_request
from gateway.wire.tools import FileSearchTool
from gateway.wire.vector_stores import store_not_found
from inference.hosted_items import ERROR_PREFIX

__all__ = ["FileSearchRunner", "FileTool", "INCLUDE_RESULTS", "check_file_tool", "file_search_namespace"]

INCLUDE_RESULTS = "file_search_call.results"
#: the model's queries per call, and their length
MAX_QUERIES = 5
MAX_QUERY_CHARS = 256
DEFAULT_MAX_RESULTS = 10


@dataclass(frozen=True, slots=True)
class FileTool:
    """One request's ``file_search`` tool, checked against the tenant's stores."""

    index: int
    store_ids: tuple[str, ...]
    max_results: int
    flt: Filter | None
    score_threshold: float
    weights: tuple[float, float] | None
    #: ``include`` asked for ``file_search_call.results``
    results: bool


async def check_file_tool(
    stores: VectorStores, index: int, model: FileSearchTool, tenant: str | None, include: Sequence[str] = ()
) -> FileTool:
    """The request's tool checked against the tenant's stores and the filter's bounds: an unknown
    store (another tenant's is one) is a 404, a bad filter a 400, each naming where."""
    for i, store_id in enumerate(dict.fromkeys(model.vector_store_ids)):
        if await stores.get(tenant, store_id) is None:
            err = store_not_found(store_id)
            err.param = f"tools[{index}].vector_store_ids[{i}]"
            raise err
    try:
        flt = parse_filter(model.filters, f"tools[{index}].filters") if model.filters is not None else None
    except FilterError as exc:
        raise bad_request(str(exc), code="invalid_value", param=exc.param) from None
    ranking = model.ranking_options
    hybrid = ranking.hybrid_search if ranking is not None else None
    return FileTool(
        index=index,
        store_ids=tuple(dict.fromkeys(model.vector_store_ids)),
        max_results=model.max_num_results or DEFAULT_MAX_RESULTS,
        flt=flt,
        score_threshold=(ranking.score_threshold or 0.0) if ranking is not None else 0.0,
        weights=(hybrid.embedding_weight, hybrid.text_weight) if hybrid is not None else None,
        results=INCLUDE_RESULTS in include,
    )


@functools.cache
def file_search_namespace() -> dict[str, Any]:
    """The tool as the model sees it: a ``file_search`` namespace with ``msearch``, its arguments
    bounded (a forced or opened call is decoded under this schema: ``inference.browser_tool`` says
    why bounds matter)."""
    return {
        "type": "namespace",
        "name": FILE_SEARCH_NAMESPACE,
        "description": (
            "Search the files the user gave you (their vector stores) for passages relevant to your "
            "queries. Each passage you get back starts with its citation mark, like 【0:2†notes.md】. "
            "When you use a passage, cite it by writing its mark exactly as shown, right after the "
            "sentence it supports."
        ),
        "tools": [
            {
                "type": "function",
                "name": "msearch",
                "description": (
                    f"Searches the files for each query (1 to {MAX_QUERIES}; a keyword query and a question "
                    "phrased the way the answer would be written both work) and returns the best passages."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "queries": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
                            "minItems": 1,
                            "maxItems": MAX_QUERIES,
                        }
                    },
                    "required": ["queries"],
                    "additionalProperties": False,
                },
                "strict": False,
            }
        ],
    }


def _queries(arguments: str) -> list[str] | str:
    """The call's queries, or why they are not usable (the model reads it)."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "the arguments are not JSON"
    if not isinstance(args, dict):
        return "the arguments are not an object"
    raw = args.get("queries", args.get("query"))
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(q, str) for q in raw):
        return "'queries' must be a list of strings"
    queries = [q.strip()[:MAX_QUERY_CHARS] for q in raw[:MAX_QUERIES] if q.strip()]
    return queries or "'queries' has no text"


class FileSearchRunner:
    """One response's ``file_search`` calls: each searches the tool's stores, shows the model the
    passages with their marks, and remembers them for the citations (``source``)."""

    kind = FILE_SEARCH

    def __init__(
        self, stores: VectorStores, tool: FileTool, tenant: str | None, clock: StageTimer, max_output_bytes: int
    ) -> None:
        self.stores = stores
        self.tool = tool
        self.tenant = tenant
        self.clock = clock
        self.max_output_bytes = max_output_bytes
        #: each call's passages, by call number (the marks' first number)
        self._shown: list[list[SearchHit]] = []

    def source(self, call: int, n: int) -> FileSource | None:
        """The file a mark ``【call:n†…】`` names, if the model was shown it."""
        if 0 <= call < len(self._shown) and 0 <= n < len(self._shown[call]):
            hit = self._shown[call][n]
            return FileSource(hit.hit.file_id, hit.filename)
        return None

    def not_run(self, function: str, text: str) -> CallResult:
        return CallResult(text, {"queries": []}, True)

    async def run(self, function: str, arguments: str) -> CallResult:
        queries = _queries(arguments)
        if isinstance(queries, str):
            return CallResult(f"{ERROR_PREFIX}{queries}.", {"queries": []}, True)
        t0 = time.perf_counter()
        best: dict[tuple[str, str, int], SearchHit] = {}
        try:
            for query in queries:
                for hit in await self.stores.search(
                    self.tenant,
                    self.tool.store_ids,
                    query,
                    max_results=self.tool.max_results,
                    flt=self.tool.flt,
                    score_threshold=self.tool.score_threshold,
                    weights=self.tool.weights,
                    via="tool",
                ):
                    key = (hit.hit.store_id, hit.hit.file_id, hit.hit.index)
                    if key not in best or best[key].hit.score < hit.hit.score:
                        best[key] = hit
        except Exception as exc:  # a store that failed: the model is told, the response goes on
            self._span(t0, len(queries), 0, type(exc).__name__)
            return CallResult(f"{ERROR_PREFIX}the search failed ({type(exc).__name__}).", {"queries": queries}, True)
        hits = sorted(best.values(), key=lambda h: (-h.hit.score, h.hit.file_id, h.hit.index))
        hits = hits[: self.tool.max_results]
        call = len(self._shown)
        self._shown.append(hits)
        text = self._screen(call, hits)
        self._span(t0, len(queries), len(hits), None)
        results = (
            [
                {
                    "file_id": h.hit.file_id,
                    "filename": h.filename,
                    "score": h.hit.score,
                    "text": h.hit.text,
                    "attributes": dict(h.hit.attributes),
                }
                for h in hits
            ]
            if self.tool.results
            else None
        )
        return CallResult(text, {"queries": queries, "results": results}, False)

    def _screen(self, call: int, hits: list[SearchHit]) -> str:
        """The passages as the model reads them, within ``max_output_bytes`` (the last ones cut)."""
        if not hits:
            return "No passage of the files matches these queries."
        parts: list[str] = []
        used = 0
        for n, h in enumerate(hits):
            part = f"【{call}:{n}†{h.filename or h.hit.file_id}】\n{h.hit.text.strip()}\n"
            size = len(part.encode())
            if used + size > self.max_output_bytes:
                parts.append(f"(… {len(hits) - n} more passages cut: the output limit was reached)")
                break
            parts.append(part)
            used += size
        return "\n".join(parts)

    def _span(self, t0: float, queries: int, hits: int, error: str | None) -> None:
        self.clock.span(  # no query or passage in a trace: they are user data
            "tool_call",
            t0,
            time.perf_counter(),
            {
                "respgate.tool.type": "file_search",
                "respgate.tool.name": "msearch",
                "respgate.tool.queries": queries,
                "respgate.tool.results": hits,
                **({"error.type": error} if error is not None else {}),
            },
        )
