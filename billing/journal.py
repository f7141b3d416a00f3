"""A crash-safe, append-only local journal of usage records (one JSON line per record).

Why it exists: the ledger lives in Redis, and Redis can be down, slow or unreachable exactly when a
turn finishes. A usage record is money, so when the ledger cannot take a batch the worker appends
it here and ``fsync``s before counting it as written; a background loop replays the journal into
the ledger later, and start-up replays whatever a killed process left behind.

Replay never truncates in place. ``rotate()`` atomically renames the live file to a uniquely named
``<path>.replay-*`` segment (new appends go to a fresh live file), the caller sends the segment to
the ledger, and only then ``discard()`` unlinks it. A crash at any point leaves either the live
file or a segment on disk, both of which the next replay picks up; the ledger is idempotent by
response id, so sending a segment twice never double-counts.

A SIGKILL during ``append`` can leave a torn last line. Reading skips lines that do not parse
(they belong to a batch that was never acknowledged), and the journal starts every append on a
fresh line so a torn tail cannot swallow the next record.

Several processes may share a path (replicas on one host with the default cache folder): appends
and ``rotate`` take an exclusive ``flock`` on the live file, so a record is never appended into a
segment that a sibling is already replaying; two replicas replaying the same segment both send it
(idempotent) and the second ``discard`` is a no-op.

Next to it live the usage write-ahead log's generations (``<path>.wal-*``, see ``billing.wal``):
the unsynced per-record copy that covers the milliseconds before a batch reaches this file or the
ledger; start-up moves a killed process's generations in here.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

_SEQ = itertools.count()


class Journal:
    """Append-only JSON-lines file with fsync per batch and rename-based replay segments."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        #: appends come from the worker's thread and (as a last resort) from the event loop
        self._lock = threading.Lock()

    # -- writing ----------------------------------------------------------------------------------

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Append records and fsync; returns how many. Durable when this returns."""
        lines = [orjson.dumps(r) + b"\n" for r in records]
        if not lines:
            return 0
        with self._lock:
            while True:
                created = not self.path.exists()
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # excludes a sibling's append and rotate
                    if not _is_live(fd, self.path):
                        continue  # a sibling rotated the file away between our open and our lock
                    prefix = b"" if created or _ends_with_newline(fd) else b"\n"  # heal a torn tail
                    view = memoryview(prefix + b"".join(lines))
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                    os.fsync(fd)
                    break
                finally:
                    os.close(fd)  # releases the lock
            if created:
                _fsync_dir(self.path.parent)  # the new file's directory entry must survive a crash too
        return len(lines)

    # -- replay -----------------------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Replay segments left on disk (oldest first), e.g. by a process killed mid-replay."""
        return sorted(self.path.parent.glob(self.path.name + ".replay-*"))

    def pending(self) -> bool:
        """Whether anything waits for replay (cheap: two stats and a directory glob)."""
        try:
            if self.path.stat().st_size > 0:
                return True
        except FileNotFoundError:
            pass
        return bool(self.segments())

    def size_bytes(self) -> int:
        """Bytes waiting for replay (live file and segments): the journal-size gauge."""
        total = 0
        for path in [self.path, *self.segments()]:
            try:
                total += path.stat().st_size
            except OSError:  # rotated or discarded between the glob and the stat
                pass
        return total

    def rotate(self) -> list[Path]:
        """Move the live file aside as a new segment; returns every segment to replay, oldest first.

        Under the file's lock, so no append (ours or a sibling process's) can land in the segment
        after the rename: an appender that opened the old file finds it renamed and reopens."""
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return self.segments()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_size > 0 and _is_live(fd, self.path):
                    stamp = f"{time.time_ns():020d}-{os.getpid()}-{next(_SEQ)}"
                    os.rename(self.path, self.path.with_name(f"{self.path.name}.replay-{stamp}"))
                    _fsync_dir(self.path.parent)
            finally:
                os.close(fd)
        return self.segments()

    @staticmethod
    def read(segment: Path) -> Generator[dict[str, Any], None, None]:
        """The records of a segment (or the live file); torn or corrupt lines are skipped, logged."""
        try:
            f = open(segment, "rb")
        except FileNotFoundError:  # a sibling replayed and discarded it first: nothing left to send
            return
        with f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning("usage journal %s: skipping unreadable line %d (torn write?)", segment, lineno)
                    continue
                if isinstance(record, dict):
                    yield record

    def discard(self, segment: Path) -> None:
        """Delete a segment once every record in it is acknowledged by the ledger."""
        segment.unlink(missing_ok=True)
        _fsync_dir(segment.parent)

    def records(self) -> list[dict[str, Any]]:
        """Everything on disk (segments, then the live file): for tests and inspection."""
        out: list[dict[str, Any]] = []
        for seg in [*self.segments(), self.path]:
            if seg.exists():
                out.extend(self.read(seg))
        return out


def _is_live(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not renamed into a segment meanwhile)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _ends_with_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
