"""The interpreter inside a local sandbox container: a tiny REPL server (issue 34).

Runs as ``/usr/bin/python3 -I -c <this file's source> <config json>`` inside bubblewrap, on the
sandbox's system Python, never the gateway's. It speaks frames on its original stdin/stdout: a
4-byte big-endian length, then UTF-8 JSON. Request ``{"code": str, "cpu_s": int}``; reply
``{"stdout", "stderr", "stdout_size", "stderr_size", "exit_status", "error", "failure"}``. Code runs
in one persistent globals dict; a last bare expression has its repr printed, as in a notebook.

Its fds 1 and 2 point at files in ``/run/out`` (a small tmpfs) while code runs, so ``print``,
``os.system`` and child processes all land there, bounded by that tmpfs; only the first ``cap``
bytes of each are sent back. Nothing here is trusted by the gateway: frames are size-checked and
files are listed from the host. Standard library only; Python 3.8+ (whatever the image has).
"""

from __future__ import annotations

import ast
import errno
import io
import json
import os
import resource
import signal
import struct
import sys
import traceback
from types import FrameType
from typing import Any, BinaryIO

OUT_DIR = "/run/out"


class _CpuTime(BaseException):
    pass


def _on_xcpu(signum: int, frame: FrameType | None) -> None:
    raise _CpuTime("CPU time limit")


def _limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _read_exact(f: BinaryIO, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(f: BinaryIO, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode("utf-8")
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def _tail_of(path: str, cap: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return f.read(cap).decode("utf-8", "replace"), size
    except OSError:
        return "", 0


def _run(code: str, env: dict[str, Any]) -> None:
    """exec the code; a last expression is evaluated and its repr printed (None prints nothing)."""
    tree = ast.parse(code, "<code>", "exec")
    last = None
    tail = tree.body[-1] if tree.body else None
    if isinstance(tail, ast.Expr):
        tree.body.pop()
        last = ast.Expression(tail.value)
    exec(compile(tree, "<code>", "exec"), env)
    if last is not None:
        value = eval(compile(last, "<code>", "eval"), env)
        if value is not None:
            print(repr(value))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    for fd in (1, 2):
        os.dup2(null, fd)
    _limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    _limit(resource.RLIMIT_NPROC, cfg["processes"])
    _limit(resource.RLIMIT_NOFILE, cfg["open_files"])
    _limit(resource.RLIMIT_FSIZE, cfg["file_bytes"])
    cpu_hard = cfg["cpu_seconds_total"]
    _limit(resource.RLIMIT_CPU, cpu_hard)
    signal.signal(signal.SIGXCPU, _on_xcpu)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversize write fails with EFBIG instead
    cap = cfg["output_bytes"]
    me = os.getpid()
    env = {"__name__": "__main__", "__builtins__": __builtins__}
    stdout_path, stderr_path = OUT_DIR + "/stdout", OUT_DIR + "/stderr"
    _send(proto_out, {"ready": True, "python": sys.version.split()[0]})
    while True:
        header = _read_exact(proto_in, 4)
        if header is None:
            return
        body = _read_exact(proto_in, struct.unpack(">I", header)[0])
        if body is None:
            return
        req = json.loads(body.decode("utf-8"))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = min(cpu_hard, int(usage.ru_utime + usage.ru_stime) + int(req["cpu_s"]) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
        for fd, path in ((1, stdout_path), (2, stderr_path)):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
        exit_status: int | None = 0
        error: str | None = None
        failure: str | None = None
        try:
            try:
                _run(req["code"], env)
            finally:
                if os.getpid() != me:  # a child the code forked came back here: it must not answer
                    os._exit(0)
        except SystemExit as e:
            exit_status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except _CpuTime:
            exit_status, error, failure = None, "CPU time limit reached", "timeout"
        except MemoryError:
            exit_status, error, failure = 1, "MemoryError: memory limit reached", "memory"
        except BaseException as e:  # the code's own exception: reported, the interpreter goes on
            exit_status = 1
            error = traceback.format_exception_only(type(e), e)[-1].strip()
            if isinstance(e, OSError) and e.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):
                failure = "disk_full"
            try:
                tb = e.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename != "<code>":
                    tb = tb.tb_next  # the server's own frames are not the code's business
                traceback.print_exception(type(e), e, tb, file=sys.stderr)
            except BaseException:
                pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        for fd in (1, 2):
            os.dup2(null, fd)
        stdout, stdout_size = _tail_of(stdout_path, cap)
        stderr, stderr_size = _tail_of(stderr_path, cap)
        if stdout_size > cap or stderr_size > cap:
            failure = "output_too_large"
        try:
            os.unlink(stdout_path)
            os.unlink(stderr_path)
        except OSError:
            pass
        _send(
            proto_out,
            {
                "stdout": stdout,
                "stderr": stderr,
                "stdout_size": stdout_size,
                "stderr_size": stderr_size,
                "exit_status": exit_status,
                "error": error,
                "failure": failure,
            },
        )


if __name__ == "__main__":
    main()
