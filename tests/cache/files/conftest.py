"""Fixtures for the chunk index backends: a real Postgres with pgvector (``tests.postgres``), one
server per test session, a fresh database per test that asks for one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A new, empty database on the session's server (``CREATE EXTENSION vector`` not yet run)."""
    return postgres_server.create_database(f"t_{uuid.uuid4().hex[:16]}")
