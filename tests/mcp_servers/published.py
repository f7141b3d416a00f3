"""A published MCP server from PyPI, run over HTTP as its packages document: the official
``mcp-server-time`` (modelcontextprotocol/servers; a stdio server) behind FastMCP's CLI, which
serves an MCP config file's stdio servers over Streamable HTTP (``fastmcp run servers.json
--transport http``, FastMCP's documented way to expose a stdio server over HTTP).

Why these two: both work offline (the time server reads the local tz database), both are built on
the same ``mcp`` 2.x SDK the gateway uses (``mcp-proxy``, the other well-known bridge, and most
FastMCP-based servers still pin ``mcp<2``), and FastMCP's proxy is what many operators put in
front of a stdio server. FastMCP's update check and banner are turned off: the test talks to
loopback only. The port is 0 (uvicorn picks one) and read back from uvicorn's log line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_RUNNING = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")


def _script(name: str) -> str | None:
    """An entry point installed beside this interpreter (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def available() -> bool:
    return _script("fastmcp") is not None and _script("mcp-server-time") is not None


@contextmanager
def running_time_server(ready_timeout: float = 60.0) -> Iterator[str]:
    """``mcp-server-time`` served over Streamable HTTP by ``fastmcp run``; yields its MCP URL."""
    fastmcp, time_server = _script("fastmcp"), _script("mcp-server-time")
    assert fastmcp and time_server, "pip install the test extra (fastmcp, mcp-server-time)"
    with tempfile.TemporaryDirectory(prefix="mcp-published-") as home:
        config = Path(home) / "servers.json"
        config.write_text(
            json.dumps({"mcpServers": {"time": {"command": time_server, "args": ["--local-timezone", "UTC"]}}})
        )
        env = {
            **os.environ,
            "FASTMCP_CHECK_FOR_UPDATES": "off",
            "FASTMCP_SHOW_SERVER_BANNER": "false",
            "FASTMCP_HOME": home,
            "FASTMCP_ENV_FILE": str(Path(home) / "none.env"),
        }
        cmd = [fastmcp, "run", str(config), "--transport", "http", "--host", "127.0.0.1", "--port", "0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=home)
        try:
            assert proc.stdout is not None
            seen = b""
            deadline = time.monotonic() + ready_timeout
            port = None
            while port is None:
                line = proc.stdout.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"fastmcp exited {proc.returncode}: {seen[-2000:].decode(errors='replace')}")
                seen += line
                match = _RUNNING.search(line)
                if match:
                    port = int(match.group(1))
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"fastmcp did not start: {seen[-2000:].decode(errors='replace')}")
            # drained from here on: a full pipe would stall the server on its next log line
            threading.Thread(target=proc.stdout.read, name="fastmcp-log", daemon=True).start()
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
