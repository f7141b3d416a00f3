"""``deploy/SCALING.md`` is computed from ``benchmarks/results/scaling.json``; they cannot drift apart.

The document's figures are rendered by ``benchmarks.scaling.render_doc`` from the committed run, so
these tests re-render it and compare byte for byte; that the plan follows the units it is given
(not figures typed into the template); that only a full run into ``benchmarks/results/`` writes
the committed document; and that the Redis probe the benchmark reads counts a client's calls and
bytes exactly, its own ``INFO`` left out.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from benchmarks import scaling

RESULT = scaling.RESULTS / "scaling.json"


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(RESULT.read_text())


def test_the_committed_document_is_the_rendering_of_the_committed_run(result):
    assert not result["quick"], "the committed figures must come from a full run"
    assert scaling.render_doc(result) == scaling.DOC.read_text(), (
        "deploy/SCALING.md differs from what benchmarks/results/scaling.json renders: "
        "run `python -m benchmarks --report-only`"
    )


def test_the_plan_follows_the_measured_units(result):
    base = scaling.plan(result)
    changed = copy.deepcopy(result)
    changed["ledger"]["marker_bytes_per_record"] *= 2
    for m in changed["idle_memory"]:
        m["bytes_per_idle_connection"] = 0.0
    for t in changed["turns"]:
        t["gateway_cpu_s_per_turn"] *= 3
    plan = scaling.plan(changed)
    assert [p["marker_mem"] for p in plan] == [2 * p["marker_mem"] for p in base]
    ws = [p for p in plan if p["ws"]]
    assert ws and all(p["mem_replicas"] == 0 and p["replicas_bound"] == "CPU" for p in ws)
    assert all(p["cpu_replicas"] > b["cpu_replicas"] for p, b in zip(plan, base))
    assert all(p["ledger_shards"] > b["ledger_shards"] for p, b in zip(plan, base))  # markers are memory
    # and the figures reach the text
    doc = scaling.render_doc(changed)
    assert doc != scaling.render_doc(result)
    assert f"**{plan[0]['replicas']:,}** (CPU)" in doc
    assert f"**{plan[0]['ledger_shards']:,}** ({plan[0]['ledger_bound']})" in doc


def test_only_a_full_run_into_results_writes_the_committed_document(result, tmp_path):
    before = scaling.DOC.read_text()
    shutil.copy(RESULT, tmp_path / "scaling.json")
    assert scaling.write_doc(tmp_path) == tmp_path / "SCALING.md"
    quick = dict(result, quick=True)
    assert scaling.doc_path(scaling.RESULTS, quick) == scaling.RESULTS / "SCALING.md"
    assert scaling.doc_path(scaling.RESULTS, result) == scaling.DOC
    assert (tmp_path / "SCALING.md").read_text() == scaling.render_doc(result)
    assert scaling.DOC.read_text() == before
    assert scaling.write_doc(tmp_path / "empty") is None


def test_the_redis_probe_counts_a_clients_calls_bytes_and_data(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.ping()  # its connection's handshake (HELLO, CLIENT SETINFO) before the counting starts
    probe = scaling.RedisProbe(redis_url)
    data0 = probe.data_bytes()
    probe.reset()
    a = probe.snap()
    value = b"x" * 1000
    for i in range(20):
        client.set(f"probe:{i}", value)
    d = probe.delta(a, probe.snap())
    unit = scaling._per_unit(d, None, 20)
    assert unit["commands_per_unit"] == {"set": 1.0}
    # SET probe:N <1000 bytes> is ~1,030 bytes of RESP in, "+OK\r\n" out; the probe's INFO is not counted
    assert 1000 < unit["net_in_bytes_per_unit"] < 1100
    assert abs(unit["net_out_bytes_per_unit"] - 5) < 3  # INFO replies vary by a few digits
    grew = probe.data_bytes()
    assert grew["keys"] == data0["keys"] + 20
    assert 20 * 1000 <= grew["other"] - data0["other"] < 20 * 1200
    assert grew["ledger"] == data0["ledger"]
