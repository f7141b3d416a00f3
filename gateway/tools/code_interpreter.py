"""``code_interpreter`` run by the gateway: the model's python runs in one of the tenant's containers
(``gateway.containers``: the registry the Containers API shares), and what it printed and the files
it wrote come back to the model at the token tip.

    request tool ──check_code_tool()──> CodeTool            (404/400 before the response; the
                                                              ``auto`` container made or reused here)
    model's call ──CodeInterpreterRunner.run()──> CallResult (never raises: a failed run is an
                                                              error the model reads, status ``failed``)

**Who runs it.** Only where the operator turned it on (settings ``code_interpreter`` and
``code_interpreter_tenants``); elsewhere a request naming it is a 400 naming the tool and the
setting (``gateway.turn.checks``), never a silent strip.

**The container.** ``container`` is a container id of the tenant's (another tenant's, or an unknown
id: a 404 naming ``tools[i].container``; an expired one: a 400) or ``{"type": "auto", "file_ids":
[...]}``: the container a ``code_interpreter_call`` of the conversation used last, when it still
lives (the request's own input items, newest first, then the last :data:`REUSE_SCAN` items of the
chain it continues: the parent's output first), else a new one with those Files API files copied
into ``/mnt/data`` (a reused container keeps the files it has). A new one the model never ran
code in is deleted when the response ends, so a chain that never calls the tool does not pile up
containers against the tenant's quota.

**What the model sees.** gpt-oss its own harmony ``python`` (raw code to recipient ``python``);
other families a namespace ``python`` with ``run(code)`` (``inference.python_tool``). What it
reads back: stdout, stderr, the error, and the files the run created or changed, each as
``sandbox:/mnt/data/<path>``, bounded by ``tool_output_bytes`` and classified as new input like
any tool output (``gateway.turn.tool_loop``).

**The citation mark.** A ``sandbox:/mnt/data/<path>`` the model writes in its answer, naming a file
a run wrote (in this response, or earlier in the reused container), becomes a
``container_file_citation`` annotation whose ``start_index``/``end_index`` span exactly that mark in
the text (the text is left as written: typically ``[chart](sandbox:/mnt/data/chart.png)``). A path
no run wrote gets no annotation.

**The item.** ``code_interpreter_call`` with ``code``, ``container_id``, ``status`` (``in_progress``
while the model writes, ``interpreting`` while it runs, then ``completed``; ``failed`` when the
sandbox ended the run — time, memory, disk, output, a crash — or the call held no code;
``incomplete`` when the response ended before it ran) and ``outputs``: null unless ``include``
names ``code_interpreter_call.outputs``, then the logs and, for each image file the run wrote,
an ``image`` output with a ``data:`` URL (at most :data:`MAX_IMAGE_BYTES`).
"""

from __future__ import annotations

import base64
import mimetypes
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.base.metrics import StageTimer
from gateway.containers.model import CodeRun, ContainerFile, Containers, ContainerStatus, FileSource
from gateway.tools.calls import CODE_INTERPRETER, CallResult
from gateway.wire.errors import ApiError
from gateway.wire.tools import CodeInterpreterTool
from inference.hosted_items import ERROR_PREFIX
from inference.item_types import ItemType
from inference.python_tool import SANDBOX_PREFIX, code_of

__all__ = [
    "INCLUDE_OUTPUTS",
    "CodeInterpreterRunner",
    "CodeTool",
    "check_code_tool",
    "container_marks",
]

INCLUDE_OUTPUTS = "code_interpreter_call.outputs"
#: items of the chain read, newest first, for the container an ``auto`` tool reuses
REUSE_SCAN = 256
#: an image file larger than this is not inlined in ``outputs`` (it can still be fetched)
MAX_IMAGE_BYTES = 8 << 20
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: a container file the model names in its answer (the citation mark): the path runs to a space,
#: a quote or a closing bracket
_MARK = re.compile(re.escape(SANDBOX_PREFIX) + r"[^\s()\[\]<>\"'`]+")
_TRAILING = ".,;:!?"


@dataclass(frozen=True, slots=True)
class CodeTool:
    """One request's ``code_interpreter`` tool, checked: its container."""

    index: int
    #: the container the response runs code in (None: a turn that does not generate made none)
    container_id: str | None
    #: the container was made for this response (``auto`` with nothing to reuse)
    created: bool
    #: ``include`` asked for ``code_interpreter_call.outputs``
    outputs: bool


def _not_found(index: int, container_id: str) -> ApiError:
    return ApiError(
        404,
        f"No container found with id '{container_id}'.",
        code="container_not_found",
        param=f"tools[{index}].container",
    )


async def check_code_tool(
    containers: Containers,
    index: int,
    model: CodeInterpreterTool,
    tenant: str | None,
    include: Sequence[str] = (),
    *,
    used: Sequence[Mapping[str, Any]] = (),
    generate: bool = True,
) -> CodeTool:
    """The request's tool against the tenant's containers: a named one must be the tenant's and
    live; ``auto`` reuses the last container ``used`` names (newest first) that still lives, else
    makes one (only for a turn that generates). Raises ``ApiError``."""
    outputs = INCLUDE_OUTPUTS in include
    container = model.container
    if isinstance(container, str):
        record = await containers.get(tenant, container)
        if record is None:
            raise _not_found(index, container)
        if record.status != ContainerStatus.RUNNING:
            raise ApiError(
                400,
                f"Container '{container}' has expired; create a new one.",
                code="container_expired",
                param=f"tools[{index}].container",
            )
        return CodeTool(index, record.id, False, outputs)
    seen: set[str] = set()
    for item in used:
        cid = item.get("container_id")
        if not isinstance(cid, str) or cid in seen:
            continue
        seen.add(cid)
        record = await containers.get(tenant, cid)
        if record is not None and record.status == ContainerStatus.RUNNING:
            return CodeTool(index, record.id, False, outputs)
    if not generate:
        return CodeTool(index, None, False, outputs)
    try:
        record = await containers.create(
            tenant,
            name="code_interpreter (auto)",
            file_ids=tuple(dict.fromkeys(container.file_ids or ())),
            memory_limit=container.memory_limit,
        )
    except ApiError as exc:
        if exc.status == 404:  # a file id the tenant does not have
            exc.param = f"tools[{index}].container.file_ids"
        raise
    return CodeTool(index, record.id, True, outputs)


def calls_used(*sources: Sequence[Mapping[str, Any]], limit: int = REUSE_SCAN) -> list[Mapping[str, Any]]:
    """The ``code_interpreter_call`` items of ``sources`` (each read newest first, at most ``limit``
    items of each), in the order an ``auto`` tool tries their containers."""
    out: list[Mapping[str, Any]] = []
    for items in sources:
        n = len(items)
        for i in range(n - 1, max(-1, n - 1 - limit), -1):
            item = items[i]
            if isinstance(item, Mapping) and item.get("type") == ItemType.CODE_INTERPRETER_CALL:
                out.append(item)
    return out


def container_marks(text: str, resolve: Any) -> list[dict[str, Any]]:
    """``container_file_citation`` annotations for the marks in ``text`` (see the module docstring):
    ``resolve(path)`` gives ``(container_id, file_id, filename)`` of a file a run wrote, or None.
    A mark's trailing sentence punctuation is left out when the path without it is the file."""
    out: list[dict[str, Any]] = []
    for m in _MARK.finditer(text):
        start, end = m.start(), m.end()
        found = resolve(text[start + len(SANDBOX_PREFIX) : end])
        while found is None and end > start + len(SANDBOX_PREFIX) and text[end - 1] in _TRAILING:
            end -= 1
            found = resolve(text[start + len(SANDBOX_PREFIX) : end])
        if found is None:
            continue
        container_id, file_id, filename = found
        out.append(
            {
                "type": "container_file_citation",
                "container_id": container_id,
                "file_id": file_id,
                "filename": filename,
                "start_index": start,
                "end_index": end,
            }
        )
    return out


def _relative(path: str) -> str:
    """A container file's path below ``/mnt/data`` (the mark's path)."""
    return path[len("/mnt/data/") :] if path.startswith("/mnt/data/") else path.lstrip("/")


def _cut(text: str, budget: int) -> str:
    """``text`` within ``budget`` UTF-8 bytes, a note saying what was cut."""
    data = text.encode()
    if len(data) <= budget:
        return text
    note = f"\n(… {len(data) - budget} more bytes of output cut: the output limit was reached)"
    keep = max(0, budget - len(note.encode()))
    return data[:keep].decode("utf-8", "ignore") + note


_FAILURES = {
    "timeout": "the run took longer than its time limit",
    "memory": "the run ran out of memory",
    "output_too_large": "the run printed more than the output limit",
    "disk_full": "the run wrote more than the container's disk allows",
    "killed": "the run was killed",
    "crashed": "the interpreter crashed",
}


class CodeInterpreterRunner:
    """One response's ``code_interpreter`` calls: each runs the model's code in the response's
    container and shows the model what came of it; the files runs wrote are kept for the citations."""

    kind = CODE_INTERPRETER

    def __init__(
        self,
        containers: Containers,
        tool: CodeTool,
        tenant: str | None,
        clock: StageTimer,
        max_output_bytes: int,
        timeout_s: float | None = None,
    ) -> None:
        assert tool.container_id is not None
        self.containers = containers
        self.tool = tool
        self.container_id: str = tool.container_id
        self.tenant = tenant
        self.clock = clock
        self.max_output_bytes = max_output_bytes
        self.timeout_s = timeout_s
        #: runs started (a container made for the response and never run in is deleted after it)
        self.runs = 0
        #: the files runs of this response wrote, by their path below ``/mnt/data``
        self._files: dict[str, ContainerFile] = {}

    @property
    def unused(self) -> bool:
        """The container was made for this response and no code ran in it."""
        return self.tool.created and self.runs == 0

    async def prime(self) -> None:
        """A reused container: the files earlier runs wrote in it, so that the answer may cite one
        written in an earlier turn of the chain (one in-memory listing, before the first pass)."""
        if self.tool.created:
            return
        try:
            listed = await self.containers.files(self.tenant, self.container_id)
        except Exception:  # gone since it was checked: the first run says so
            return
        for f in listed:
            if f.source == FileSource.ASSISTANT:
                self._files.setdefault(_relative(f.path), f)

    def pending(self) -> dict[str, Any]:
        """The item's fields the kind cannot know: the container."""
        return {"container_id": self.container_id}

    def source(self, path: str) -> tuple[str, str, str] | None:
        """``(container_id, file_id, filename)`` of the file at ``path`` (below ``/mnt/data``), if
        a run wrote it (in this response, or before in a reused container)."""
        f = self._files.get(path)
        if f is None:
            return None
        return f.container_id, f.id, posixpath.basename(f.path)

    def not_run(self, function: str, text: str) -> CallResult:
        return CallResult(text, {"outputs": None}, True)

    async def run(self, function: str, arguments: str) -> CallResult:
        code = code_of(function, arguments)
        if code is None or not code.strip():
            return CallResult(f"{ERROR_PREFIX}the call held no code to run.", {"outputs": None}, True)
        self.runs += 1
        t0 = time.perf_counter()
        try:
            done = await self.containers.run(self.tenant, self.container_id, code, self.timeout_s)
        except KeyError:
            self._span(t0, "expired")
            return CallResult(
                f"{ERROR_PREFIX}the container has expired; its files and variables are gone.", {"outputs": None}, True
            )
        except ApiError as exc:  # the sandbox could not run it (overloaded, unavailable)
            self._span(t0, exc.code or "unavailable")
            return CallResult(f"{ERROR_PREFIX}the code could not be run: {exc.message}", {"outputs": None}, True)
        except Exception as exc:  # never a 5xx: the model hears of it, the response goes on
            self._span(t0, type(exc).__name__)
            text = f"{ERROR_PREFIX}the code could not be run ({type(exc).__name__})."
            return CallResult(text, {"outputs": None}, True)
        result = done.result
        for f in done.files:
            self._files[_relative(f.path)] = f
        failed = result.failure is not None
        self._span(t0, str(result.failure) if failed else None)
        outputs = await self._outputs(done) if self.tool.outputs else None
        return CallResult(self._screen(done), {"outputs": outputs}, failed)

    def _screen(self, done: CodeRun) -> str:
        """What the model reads: the logs, then the error, then the files written (the last two are
        never cut; the logs are, to fit ``max_output_bytes``)."""
        r = done.result
        tail: list[str] = []
        if r.failure is not None:
            why = _FAILURES.get(str(r.failure), str(r.failure))
            detail = f" ({r.error})" if r.error else ""
            lost = " The interpreter was restarted: variables are lost, files are kept." if r.state_lost else ""
            tail.append(f"{ERROR_PREFIX}{why}{detail}.{lost}")
        elif r.error:
            tail.append(r.error)
        if done.files:
            listed = ", ".join(f"{SANDBOX_PREFIX}{_relative(f.path)} ({f.bytes} bytes)" for f in done.files)
            tail.append(f"Files written: {listed}")
        tail_text = "\n".join(tail)
        logs = r.stdout + (("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr if r.stderr else "")
        if r.stdout_truncated or r.stderr_truncated:
            logs += "\n(… the sandbox cut the output at its limit)"
        if not logs and not tail_text:
            return "(the code ran and printed nothing)"
        budget = max(0, self.max_output_bytes - len(tail_text.encode()) - 1)
        body = _cut(logs.rstrip("\n"), budget) if logs else ""
        text = "\n".join(p for p in (body, tail_text) if p)
        return _cut(text, self.max_output_bytes)

    async def _outputs(self, done: CodeRun) -> list[dict[str, Any]]:
        """The item's ``outputs``: the logs, then each image file the run wrote as a ``data:`` URL."""
        r = done.result
        logs = r.stdout + r.stderr
        if r.error and r.error not in r.stderr:  # a sandbox failure's words (a traceback is in stderr)
            logs += ("\n" if logs and not logs.endswith("\n") else "") + r.error
        out: list[dict[str, Any]] = [{"type": "logs", "logs": logs}]
        for f in done.files:
            mime = mimetypes.guess_type(f.path)[0]
            if mime not in IMAGE_TYPES or f.bytes > MAX_IMAGE_BYTES:
                continue
            try:
                data = await self.containers.read(self.tenant, self.container_id, f.id)
            except Exception:  # gone since (expired): the logs still say it was written
                data = None
            if data is not None and len(data) <= MAX_IMAGE_BYTES:
                out.append({"type": "image", "url": f"data:{mime};base64,{base64.b64encode(data).decode()}"})
        return out

    def _span(self, t0: float, error: str | None) -> None:
        self.clock.span(  # no code or output in a trace: they are user data
            "tool_call",
            t0,
            time.perf_counter(),
            {
                "respgate.tool.type": "code_interpreter",
                "respgate.tool.name": "python",
                **({"error.type": error} if error is not None else {}),
            },
        )
