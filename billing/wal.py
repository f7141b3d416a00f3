"""The usage write-ahead log: closes the window between "the client saw the end" and "durable".

Why it exists: ``UsageQueue.submit`` runs before the terminal event goes to the client, but the
record becomes durable only when the worker's batch is acknowledged by the ledger or fsync'd to
the journal, a few milliseconds later. A SIGKILL (or OOM kill, or crash) in that window would lose
records whose responses the client already saw complete. So ``submit`` first appends the record's
JSON line here, with one plain ``os.write`` on an fd opened ``O_APPEND`` once.

What it guarantees, precisely:

* **Process death** (SIGKILL, OOM killer, segfault, ``os._exit``): covered. ``write(2)`` has
  copied the line into the kernel's page cache when it returns; the file keeps it after the
  process is gone. The next start (``recover``) moves it into the journal and fsyncs.
* **Power loss / kernel crash**: *not* covered by the WAL — there is deliberately no fsync here
  (it would cost each turn a disk flush). On power loss the guarantee is what it was without the
  WAL: a record is durable once its batch is acknowledged by the ledger or fsync'd into the
  journal (the per-batch fsync), i.e. at most one batch round trip (milliseconds) can be lost.

Generations: each process writes ``<journal>.wal-<stamp>`` files. A generation records how many
of its records are not yet acknowledged (``ack`` is called when the ledger answered or the journal
fsync'd). The live generation is truncated in place whenever all its records are acknowledged (the
common case under light load), and replaced by a new file once it exceeds ``max_bytes`` or
``max_age_s`` (continuous load); a closed generation is deleted when its last record is
acknowledged. Disk use is therefore bounded by the unacknowledged records plus one generation.

Ownership: a process holds an exclusive ``flock`` on each of its generations for as long as the
file exists, and ``recover`` only touches generations it can lock — so replicas that share a
journal folder never steal each other's live WAL, and a killed process's locks vanish with it.
Recovery may copy a record that had already reached the ledger: harmless, the ledger counts a
response id once.

Threading: every method runs on the event loop's thread (``submit`` and the worker's
continuations), so there is no lock.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from billing.journal import Journal, _fsync_dir

log = logging.getLogger(__name__)

_SEQ = itertools.count()


@dataclass(slots=True)
class _Generation:
    path: Path
    fd: int
    opened: float  # time.monotonic()
    nbytes: int = 0
    unacked: int = 0


class WriteAheadLog:
    """Unsynced per-record appends in rotating generations; see the module docstring."""

    def __init__(
        self, journal_path: str | os.PathLike[str], *, max_bytes: int = 4 * 1024 * 1024, max_age_s: float = 30.0
    ) -> None:
        self.base = Path(journal_path).expanduser()
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._live: _Generation | None = None
        #: generations with records not yet acknowledged, the live one included, by path
        self._gens: dict[Path, _Generation] = {}
        #: response id -> the generation(s) holding its unacknowledged line(s)
        self._where: dict[str, list[_Generation]] = {}
        #: counters, for tests and inspection
        self.appended = 0
        self.rotations = 0
        self.failures = 0

    # -- the hot path -----------------------------------------------------------------------------

    def append(self, response_id: str, line: bytes) -> bool:
        """Append one record's JSON line (newline included); False if the disk refused it (the
        record then lives in memory only, as before the WAL existed). One ``write`` syscall."""
        try:
            gen = self._live
            if gen is None or gen.nbytes >= self.max_bytes or time.monotonic() - gen.opened >= self.max_age_s:
                gen = self._rotate()
            view = memoryview(line)
            while view:  # a regular file takes the whole line at once unless the disk is full
                n = os.write(gen.fd, view)
                view = view[n:]
        except OSError:
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.exception("usage WAL append failed (%d so far); records rely on the queue alone", self.failures)
            return False
        gen.nbytes += len(line)
        gen.unacked += 1
        self._where.setdefault(response_id, []).append(gen)
        self.appended += 1
        return True

    def ack(self, response_ids: Iterable[str]) -> None:
        """These records are durable elsewhere (ledger or fsync'd journal): release their lines."""
        emptied: list[_Generation] = []
        for rid in response_ids:
            gens = self._where.get(rid)
            if not gens:
                continue  # submitted while the WAL could not write, or acknowledged already
            gen = gens.pop(0)
            if not gens:
                del self._where[rid]
            gen.unacked -= 1
            if gen.unacked == 0:
                emptied.append(gen)
        for gen in emptied:
            if gen.unacked:
                continue
            try:
                if gen is self._live:
                    os.ftruncate(gen.fd, 0)  # O_APPEND: the next write starts at 0 again
                    gen.nbytes = 0
                else:
                    self._drop(gen)
            except OSError:
                log.exception("usage WAL: could not release %s (recovered at next start)", gen.path)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def generations(self) -> list[Path]:
        """This process's generation files on disk, oldest first."""
        return sorted(self._gens, key=lambda p: p.name)

    @property
    def unacked(self) -> int:
        return sum(g.unacked for g in self._gens.values())

    def close(self) -> None:
        """Shutdown: delete every fully acknowledged generation; the others stay for ``recover``."""
        self._live = None
        for gen in list(self._gens.values()):
            if gen.unacked == 0:
                self._drop(gen)
            else:
                log.warning("usage WAL %s keeps %d unacknowledged records for the next start", gen.path, gen.unacked)
                del self._gens[gen.path]
                os.close(gen.fd)  # releases the lock: the next start (or a sibling) recovers it
        self._where.clear()

    def recover(self, journal: Journal) -> int:
        """Start-up: move generations left by dead processes into ``journal`` (fsync'd), then
        delete them. Returns how many records were moved. Generations locked by a live process
        (a sibling replica sharing the folder, or this one) are left alone."""
        moved = 0
        for path in sorted(self.base.parent.glob(self.base.name + ".wal-*")):
            if path in self._gens:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its writer is alive
                if not _same_file(fd, path):
                    continue  # deleted (and maybe recreated) under us: a later pass sees the new one
                records = list(Journal.read(path))  # a torn last line (killed mid-write) is skipped
                if records:
                    journal.append(records)  # fsync'd: only now may the WAL file go
                    moved += len(records)
                    log.warning(
                        "usage WAL %s: %d records from a killed process moved to the journal", path.name, len(records)
                    )
                path.unlink(missing_ok=True)
                _fsync_dir(path.parent)
            except OSError:
                log.exception("usage WAL %s: recovery failed; left in place for the next start", path)
            finally:
                os.close(fd)
        return moved

    # -- generations ------------------------------------------------------------------------------

    def _rotate(self) -> _Generation:
        old = self._live
        self._live = None
        if old is not None:
            self.rotations += 1
            if old.unacked == 0:
                self._drop(old)
        self.base.parent.mkdir(parents=True, exist_ok=True)
        while True:
            path = self.base.with_name(f"{self.base.name}.wal-{time.time_ns():020d}-{os.getpid()}-{next(_SEQ)}")
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # ours until deleted; see ``recover`` for the race
            if _same_file(fd, path):
                break
            os.close(fd)  # a recovering sibling locked the empty file first and removed it
        gen = self._live = self._gens[path] = _Generation(path, fd, time.monotonic())
        return gen

    def _drop(self, gen: _Generation) -> None:
        self._gens.pop(gen.path, None)
        try:
            gen.path.unlink(missing_ok=True)  # unlink before close: the lock covers the whole life
        finally:
            os.close(gen.fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def record_line(record: object) -> bytes:
    """A usage record (a ``msgspec.Struct``) as one JSON line, the journal's format."""
    return msgspec.json.encode(record) + b"\n"
