"""The REPL server's reply frame (:mod:`security.sandbox.repl_server`) read into a
:class:`~security.sandbox.base.RunResult` on the gateway's side, for every backend that runs that
server (local, kubernetes). Nothing from inside is trusted: the logs are capped again at
``Limits.output_bytes``, the error cut, a failure kept only when it is one of ours, and a folder
past its quota made ``disk_full`` whatever the reply said."""

from __future__ import annotations

from collections.abc import Mapping

from security.sandbox.base import Failure, FileEntry, Limits, RunResult

__all__ = ["result_of"]

#: characters of the code's error the model reads
MAX_ERROR_CHARS = 2000


def result_of(
    reply: Mapping[str, object],
    files: tuple[FileEntry, ...],
    folder_total: int,
    limits: Limits,
    *,
    state_lost: bool,
    took: float,
) -> RunResult:
    cap = limits.output_bytes

    def text(key: str) -> tuple[str, bool]:
        value, size = reply.get(key), reply.get(f"{key}_size")
        s = value if isinstance(value, str) else ""
        s = s.encode("utf-8", "replace")[:cap].decode("utf-8", "ignore")
        return s, isinstance(size, int) and size > cap

    stdout, out_cut = text("stdout")
    stderr, err_cut = text("stderr")
    status = reply.get("exit_status")
    raw_failure = reply.get("failure")
    failure = Failure(raw_failure) if raw_failure in {f.value for f in Failure} else None
    err = reply.get("error")
    error = err[:MAX_ERROR_CHARS] if isinstance(err, str) else None
    if folder_total > limits.folder_bytes:
        failure = Failure.DISK_FULL
        error = f"the container folder passed {limits.folder_bytes} bytes"
    return RunResult(
        stdout,
        stderr,
        status if isinstance(status, int) and not isinstance(status, bool) else None,
        failure,
        error,
        files,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        state_lost=state_lost,
        duration_s=took,
    )
