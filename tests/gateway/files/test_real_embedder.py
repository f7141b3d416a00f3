"""The default install's embedding path, end to end and offline (issue 33): a live gateway with
``embeddings="local"`` and no embedder override — so the packaged all-MiniLM-L6-v2 through
sentence-transformers, as ``respgate serve`` runs it — takes the corpus through the openai SDK
(``file_batches.upload_and_poll``) and ``vector_stores.search`` puts the labelled file in the top 5.

The queries are paraphrases (no content word shared with the answer) that the simulated embedder's
hashed words and BM25 do not find (``benchmarks/results/file_search_quality.md``), and one exact
identifier: only a model that embeds meaning passes. No hub is asked: the model loads from its
package folder with ``local_files_only``; ``HF_HUB_OFFLINE=1`` and a hub address nothing listens on
are set as well, so an attempt would fail here rather than reach out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.base.settings import Settings
from tests.conftest import LiveGateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
#: labelled queries (tests/corpus/queries.json): q19, q25, q27, q33 paraphrases, q02 an identifier
QUERIES = ("q19", "q25", "q27", "q33", "q02")


def _labelled() -> tuple[list[Path], dict[str, dict[str, Any]]]:
    data = json.loads((CORPUS / "queries.json").read_text())
    return [CORPUS / name for name in data["documents"]], {q["id"]: q for q in data["queries"]}


def test_the_packaged_model_ranks_the_labelled_file_in_the_top_5(
    make_gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    settings = Settings(files_dir=str(tmp_path / "files"), embeddings="local")
    live: LiveGateway = make_gateway(settings)  # no embedder=: the one the settings name
    client = live.openai(timeout=300)
    documents, queries = _labelled()
    store = client.vector_stores.create(name="corpus")
    handles = [path.open("rb") for path in documents]
    try:
        batch = client.vector_stores.file_batches.upload_and_poll(store.id, files=handles, poll_interval_ms=200)
    finally:
        for h in handles:
            h.close()
    assert batch.status == "completed" and batch.file_counts.completed == len(documents), batch
    found: dict[str, list[str]] = {}
    for qid in QUERIES:
        hits = client.vector_stores.search(store.id, query=queries[qid]["query"], max_num_results=5)
        found[qid] = [h.filename for h in hits.data]
    missed = {qid: files for qid, files in found.items() if not set(queries[qid]["answers"]) & set(files)}
    assert missed == {}, missed
