"""What the usage write-ahead log costs ``UsageQueue.submit``, per record.

``submit`` runs on the turn's critical path (before the terminal event is sent), so the WAL's one
``os.write`` per record is paid by every response. This measures ``submit`` with the WAL on and
off side by side, in alternating rounds of ``--batch`` records (the order flips every round), so
machine noise hits both alike; the difference is the WAL. The worker is not running: what is
timed is exactly the turn's share (encode the line, write it, deque append). Between rounds every
record is acknowledged, as the worker would, so the WAL truncates its generation like in service;
ack cost is reported separately (the worker pays it, off the turn's path).

    python -m benchmarks.usage_submit [--rounds 200] [--batch 256] [--dir /tmp]

Writes ``benchmarks/results/usage_submit.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from billing.journal import Journal
from billing.usage import MemorySink, UsageQueue, UsageRecord


class DurableMemorySink(MemorySink):
    durable = True  # so the queue turns its WAL on by default


def make_record(i: int) -> UsageRecord:
    return UsageRecord(
        response_id=f"resp_{i:016x}",
        model="gpt-oss-120b",
        tenant="k_3f9a0c",
        status="completed",
        input_tokens=12_345 + i,
        cached_tokens=12_000,
        output_tokens=321,
        reasoning_tokens=64,
        transport="ws",
        created_at=1_700_000_000.0 + i,
        finished_at=1_700_000_001.5 + i,
        ttft_s=0.041,
        duration_s=1.5,
    )


def run(rounds: int, batch: int, folder: Path) -> dict[str, Any]:
    journal = Journal(folder / "usage-journal.jsonl")
    queues = {
        "wal": UsageQueue(DurableMemorySink(), journal, maxsize=batch + 1),
        "no_wal": UsageQueue(DurableMemorySink(), journal, maxsize=batch + 1, wal=False),
    }
    assert queues["wal"].wal is not None and queues["no_wal"].wal is None
    per_record: dict[str, list[float]] = {k: [] for k in queues}
    ack_us: list[float] = []
    n = 0
    for rnd in range(rounds + 20):  # 20 warm-up rounds
        order = list(queues) if rnd % 2 == 0 else list(reversed(queues))
        for name in order:
            q = queues[name]
            records = [make_record(n + i) for i in range(batch)]
            n += batch
            t0 = time.perf_counter_ns()
            for r in records:
                q.submit(r)
            t1 = time.perf_counter_ns()
            q._queue.clear()  # what the worker takes; then it acknowledges them
            if q.wal is not None:
                t2 = time.perf_counter_ns()
                q.wal.ack(r.response_id for r in records)
                if rnd >= 20:
                    ack_us.append((time.perf_counter_ns() - t2) / 1000 / batch)
            if rnd >= 20:
                per_record[name].append((t1 - t0) / 1000 / batch)
    wal = queues["wal"].wal
    assert wal is not None and wal.unacked == 0
    med = {k: statistics.median(v) for k, v in per_record.items()}
    return {
        "rounds": rounds,
        "batch": batch,
        "folder": str(folder),
        "submit_us_per_record_median": med,
        "submit_us_per_record_p90": {k: statistics.quantiles(v, n=10)[-1] for k, v in per_record.items()},
        "wal_cost_us_per_record": med["wal"] - med["no_wal"],
        "ack_us_per_record_median": statistics.median(ack_us),
        "wal_appended": wal.appended,
        "wal_rotations": wal.rotations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dir", default=None, help="where the journal and WAL live (default: a temp dir)")
    args = parser.parse_args()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = run(args.rounds, args.batch, Path(tmp))
    result.update(
        load_avg_start=load_start,
        load_avg_end=os.getloadavg(),
        python=platform.python_version(),
        machine=platform.machine(),
    )
    out = Path(__file__).resolve().parent / "results" / "usage_submit.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    med = result["submit_us_per_record_median"]
    print(
        f"submit, median per record: WAL {med['wal']:.2f} us, no WAL {med['no_wal']:.2f} us "
        f"-> WAL costs {result['wal_cost_us_per_record']:.2f} us; ack {result['ack_us_per_record_median']:.2f} us "
        f"(worker side); {result['wal_rotations']} rotations"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
