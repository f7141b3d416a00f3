"""Builds one response's streaming events in OpenAI's exact order.

The builder owns the response's status machine (read it as a table)::

    queued ------created()---> in_progress   (background responses only)
    in_progress --complete()--> completed
    in_progress --incomplete()--> incomplete
    in_progress --fail()------> failed
    in_progress --cancel()----> cancelled
    any terminal --*----------> IllegalTransition

and the numbering every client relies on: ``sequence_number`` dense from 0 with
``response.created`` first, ``output_index`` dense in ``output_item.added`` order, one open item at a
time. Parser events (``inference.parse``) go in; Responses event dicts come out, identical for SSE
and WebSocket (transports only add framing and, on lanes, ``stream_id``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from gateway.tools.approvals import Decision
from gateway.tools.calls import CallKind, CallResult, kind_of_item
from gateway.tools.citations import CitationWriter
from gateway.tools.code_interpreter import container_marks
from gateway.tools.hosted import HostedTurn
from gateway.wire.items import new_id
from gateway.wire.kinds import TERMINAL_EVENT, ItemType, ResponseStatus, call_kind
from inference.parse import ItemDelta, ItemEnd, ItemStart, ParseEvent
from inference.python_tool import PYTHON, code_of

Event = dict[str, Any]


def wire_event(ev: Event, tools_json: Any) -> Event:
    """``ev`` as a transport serializes it: a Response it carries names its ``tools`` by their JSON,
    built once per tool set (``PreparedTurn.tools_json``, an ``orjson.Fragment``) instead of three
    times a turn. The event itself is not changed: readers and stores keep the list."""
    if tools_json is None:
        return ev
    response = ev.get("response")
    if response is None:
        return ev
    return dict(ev, response=dict(response, tools=tools_json))


class IllegalTransition(RuntimeError):
    pass


class ResponseEvents:
    def __init__(
        self,
        response: dict[str, Any],
        *,
        reasoning_mode: str = "raw",
        seal: Callable[[str], str] | None = None,
        hosted: HostedTurn | None = None,
        citations: Callable[[], CitationWriter] | None = None,
        calls: Sequence[CallKind] = (),
        call_fields: Mapping[str, Mapping[str, Any]] | None = None,
        container_files: Callable[[str], tuple[str, str, str] | None] | None = None,
    ) -> None:
        """``reasoning_mode``: ``raw`` streams reasoning_text, ``summary`` streams it as a summary
        part, ``hidden`` emits the reasoning item without text events. ``seal`` (when the client asked
        for ``reasoning.encrypted_content``) turns reasoning text into an opaque blob. ``citations``
        (when the response runs a tool whose results the model cites: ``web_search``,
        ``file_search``) makes each message's citation writer: the model's marks become
        annotations (``gateway.tools.citations``). ``calls``: the hosted tools the
        model calls through a namespace in this response (``gateway.tools.calls``), and
        ``call_fields`` the fields their items carry from the start, by namespace (the container of
        ``code_interpreter``). ``container_files(path)``: the file a ``code_interpreter`` run wrote
        at ``path`` below ``/mnt/data`` as ``(container_id, file_id, filename)``; a message's
        ``sandbox:/mnt/data/<path>`` marks become ``container_file_citation`` annotations."""
        self.response = response
        self.output: list[dict[str, Any]] = response["output"]
        self._seq = 0
        self._open: dict[str, Any] | None = None
        #: the open item's delta event: its type (None: no text events) and index field, its id
        #: and output index, fixed when the item opens so that a delta is one dict literal
        self._delta_type: str | None = None
        self._delta_index: str | None = None
        self._open_id = ""
        self._open_idx = 0
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._reasoning_mode = reasoning_mode
        self._seal = seal
        #: the turn's MCP servers: a call into one of their namespaces is the gateway's to run
        self._hosted = hosted if hosted is not None and hosted.active else None
        #: output indices of gateway-run calls whose arguments are complete and that have not run
        self._to_run: list[int] = []
        #: the namespaces the model calls hosted tools through, and their kinds
        self._calls = {k.namespace: k for k in calls}
        #: the function and the model's arguments of each such call by output index (the item has
        #: neither: its fields are built from them when it ran)
        self._call_args: dict[int, tuple[str, str]] = {}
        self._call_fields = call_fields or {}
        self._container_files = container_files
        self._citations = citations
        #: the open message's citation writer (only with ``citations``)
        self._cite: CitationWriter | None = None
        self._annotations: list[dict[str, Any]] = []

    # -- envelope -------------------------------------------------------------------------------

    def _ev(self, type_: str, **fields: Any) -> Event:
        ev = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def _snapshot(self) -> dict[str, Any]:
        snap = dict(self.response)
        snap["output"] = list(self.output)
        return snap

    @property
    def status(self) -> str:
        status: str = self.response["status"]
        return status

    def created(self) -> list[Event]:
        if self.response["status"] == ResponseStatus.QUEUED:  # background: OpenAI's order, queued first
            queued = [
                self._ev("response.created", response=self._snapshot()),
                self._ev("response.queued", response=self._snapshot()),
            ]
            self.response["status"] = ResponseStatus.IN_PROGRESS
            return queued + [self._ev("response.in_progress", response=self._snapshot())]
        return [
            self._ev("response.created", response=self._snapshot()),
            self._ev("response.in_progress", response=self._snapshot()),
        ]

    # -- items ----------------------------------------------------------------------------------

    def feed(self, events: list[ParseEvent], logprobs: dict[int, list[dict[str, Any]]] | None = None) -> list[Event]:
        """``logprobs``: for the ``ItemDelta`` at an index of ``events``, the logprob entries of the
        tokens that wrote it (message text only; ``gateway.turn.logprobs``)."""
        if (
            len(events) == 1
            and not logprobs
            and self._open is not None
            and self._cite is None
            and type(events[0]) is ItemDelta
        ):
            ev = self._delta(events[0].text)  # a token of the open item: most engine deltas
            return [] if ev is None else [ev]
        out: list[Event] = []
        for i, pe in enumerate(events):
            if isinstance(pe, ItemDelta):  # the common case: one per engine delta
                if self._open is None:
                    out += self._open_item(ItemStart("message", phase="final"))
                if self._cite is not None:
                    out += self._cited(pe.text, logprobs.get(i) if logprobs else None)
                    continue
                ev = self._delta(pe.text, logprobs.get(i) if logprobs else None)
                if ev is not None:
                    out.append(ev)
            elif isinstance(pe, ItemStart):
                if self._open is not None:
                    out += self._close_item(complete=True)
                out += self._open_item(pe)
            elif isinstance(pe, ItemEnd):
                if self._open is not None:
                    out += self._close_item(pe.complete)
        return out

    def whole_item(self, item: dict[str, Any]) -> list[Event]:
        """An item that is complete when it appears (a ``compaction``): its added/done pair."""
        if self._open is not None:
            raise IllegalTransition("another output item is still open")
        idx = len(self.output)
        self.output.append(item)
        return [
            self._ev("response.output_item.added", output_index=idx, item=dict(item)),
            self._ev("response.output_item.done", output_index=idx, item=item),
        ]

    def _open_item(self, start: ItemStart) -> list[Event]:
        idx = len(self.output)
        self._text = []
        self._logprobs = []
        if start.kind == "message":
            # phase: the harmony channel as OpenAI names it (OpenResponses types it as a string, so
            # it is always set; chat-template models only ever write final answers)
            item: dict[str, Any] = {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
                "phase": "commentary" if start.phase == "commentary" else "final_answer",
            }
            if self._citations is not None:
                self._cite, self._annotations = self._citations(), []
        elif start.kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        elif start.namespace is not None and start.namespace in self._calls:
            return self._open_call(start, idx, self._calls[start.namespace])
        elif start.namespace is None and start.name == PYTHON and PYTHON in self._calls:
            # gpt-oss's built-in python: recipient ``python``, no namespace (``inference.python_tool``)
            return self._open_call(start, idx, self._calls[PYTHON])
        elif self._hosted is not None and start.namespace in self._hosted.servers:
            return self._open_hosted(start, idx)
        else:  # a tool call: its shape comes from the kinds map
            kind = call_kind(start.kind)
            assert kind is not None, start.kind
            item = {
                "id": new_id(kind.id_prefix),
                "type": kind.call,
                "status": "in_progress",
                "call_id": new_id("call")[:29],
                "name": start.name or "",
                kind.payload: "",
                "namespace": start.namespace or None,
                "async": None,
                "caller": None,
            }
        self._open = item
        self._open_id, self._open_idx = item["id"], idx
        self._delta_type, self._delta_index = _delta_event(item["type"], self._reasoning_mode)
        self.output.append(item)
        events = [
            self._ev(
                "response.output_item.added",
                output_index=idx,
                item=dict(item, content=list(item["content"])) if "content" in item else dict(item),
            )
        ]
        shape = (
            _MESSAGE_PART
            if start.kind == "message"
            else _REASONING_PARTS.get(self._reasoning_mode)
            if start.kind == "reasoning"
            else None
        )
        if shape is not None:
            part = _text_part("") if shape is _MESSAGE_PART else {"type": shape.part_type, "text": ""}
            seq = self._seq
            self._seq = seq + 1
            events.append(
                {
                    "type": shape.added,
                    "sequence_number": seq,
                    "item_id": item["id"],
                    "output_index": idx,
                    shape.index_field: 0,
                    "part": part,
                }
            )
        return events

    def _open_hosted(self, start: ItemStart, idx: int) -> list[Event]:
        """The model calls a tool of an MCP server: an ``mcp_call`` the gateway runs once its
        arguments are complete, or an ``mcp_approval_request`` that ends the response."""
        assert self._hosted is not None and start.namespace is not None
        label, name = start.namespace, start.name or ""
        if self._hosted.decide(label, name) == Decision.APPROVE:
            item: dict[str, Any] = {
                "id": new_id("mcpr"),
                "type": "mcp_approval_request",
                "server_label": label,
                "name": name,
                "arguments": "",
            }
            self._delta_type = None
        else:
            item = _mcp_call(label, name)
            self._delta_type = "response.mcp_call_arguments.delta"
        self._delta_index = None
        self._open = item
        self._open_id, self._open_idx = item["id"], idx
        self.output.append(item)
        events = [self._ev("response.output_item.added", output_index=idx, item=dict(item))]
        if item["type"] == "mcp_call":
            events.append(self._ev("response.mcp_call.in_progress", item_id=item["id"], output_index=idx))
        return events

    def _open_call(self, start: ItemStart, idx: int, kind: CallKind) -> list[Event]:
        """The model calls a hosted tool of its namespace (``web_search``'s browser): its item, which
        the gateway runs once the call's arguments are complete. What it will do is known then;
        until then the item names only the function chosen (``CallKind.pending``)."""
        item: dict[str, Any] = {
            "id": new_id(kind.id_prefix),
            "type": kind.item_type.value,
            "status": "in_progress",
            **kind.pending(start.name or ""),
            **self._call_fields.get(kind.namespace, {}),
        }
        self._delta_type, self._delta_index = None, None  # the arguments are not streamed (as OpenAI)
        if kind.code and start.name == PYTHON:  # raw code (harmony's python): streamed as it is written
            self._delta_type = kind.code_event("delta")
        self._open = item
        self._open_id, self._open_idx = item["id"], idx
        self.output.append(item)
        self._call_args[idx] = (start.name or "", "")
        return [
            self._ev("response.output_item.added", output_index=idx, item=dict(item)),
            self._ev(kind.event("in_progress"), item_id=item["id"], output_index=idx),
        ]

    def call_of(self, idx: int) -> tuple[str, str]:
        """A hosted call's function and the model's arguments."""
        return self._call_args.get(idx, ("", ""))

    def running(self, idx: int, kind: CallKind) -> list[Event]:
        """A hosted call starts running (``searching``)."""
        item = self.output[idx]
        item["status"] = kind.running
        return [self._ev(kind.event(kind.running), item_id=item["id"], output_index=idx)]

    def ran(self, idx: int, kind: CallKind, result: CallResult) -> list[Event]:
        """A hosted call finished: its fields, then ``completed`` (a failure ends ``failed``, and
        has no event of its own in the API: its ``output_item.done`` says it)."""
        item = self.output[idx]
        item.update(result.fields)
        item["status"] = "failed" if result.failed else "completed"
        events = [] if result.failed else [self._ev(kind.event("completed"), item_id=item["id"], output_index=idx)]
        return events + [self._ev("response.output_item.done", output_index=idx, item=item)]

    def open_call(self, request: dict[str, Any]) -> list[Event]:
        """An approved ``mcp_approval_request`` becomes an ``mcp_call`` of this response (it runs
        before the model generates): added with its arguments, to run."""
        if self._open is not None:
            raise IllegalTransition("another output item is still open")
        item = _mcp_call(request["server_label"], request["name"], request.get("arguments", ""), request["id"])
        idx = len(self.output)
        self.output.append(item)
        self._to_run.append(idx)
        return [
            self._ev("response.output_item.added", output_index=idx, item=dict(item)),
            self._ev("response.mcp_call.in_progress", item_id=item["id"], output_index=idx),
            self._ev(
                "response.mcp_call_arguments.done", item_id=item["id"], output_index=idx, arguments=item["arguments"]
            ),
        ]

    def _cited(self, text: str, logprobs: list[dict[str, Any]] | None, final: bool = False) -> list[Event]:
        """A message's text through its citation writer: what may be shown now, and an
        ``annotation.added`` event for each citation it completed."""
        assert self._cite is not None
        shown, annotations = self._cite.finish() if final else self._cite.feed(text)
        out: list[Event] = []
        ev = self._delta(shown, logprobs)
        if ev is not None:
            out.append(ev)
        elif logprobs:
            self._logprobs += logprobs
        for ann in annotations:
            out.append(
                self._ev(
                    "response.output_text.annotation.added",
                    item_id=self._open_id,
                    output_index=self._open_idx,
                    content_index=0,
                    annotation_index=len(self._annotations),
                    annotation=ann,
                )
            )
            self._annotations.append(ann)
        return out

    def take_calls(self) -> list[int]:
        """The output indices of the gateway-run calls ready to run (each handed out once)."""
        out, self._to_run = self._to_run, []
        return out

    def call_done(self, idx: int, output: str | None, error: dict[str, Any] | None) -> list[Event]:
        """A gateway-run call finished (``error``: it failed, or never ran): its result, then its
        ``output_item.done``."""
        item = self.output[idx]
        item["output"], item["error"] = output, error
        item["status"] = "failed" if error is not None else "completed"
        kind = "response.mcp_call.failed" if error is not None else "response.mcp_call.completed"
        return [
            self._ev(kind, item_id=item["id"], output_index=idx),
            self._ev("response.output_item.done", output_index=idx, item=item),
        ]

    def listing(self, item: dict[str, Any]) -> list[Event]:
        """An ``mcp_list_tools`` item (listed while the turn was prepared): its events, in OpenAI's
        order; ``failed`` when the server could not list."""
        if self._open is not None:
            raise IllegalTransition("another output item is still open")
        idx = len(self.output)
        self.output.append(item)
        ended = "response.mcp_list_tools.failed" if item.get("error") else "response.mcp_list_tools.completed"
        return [
            self._ev("response.output_item.added", output_index=idx, item=dict(item, tools=[])),
            self._ev("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=idx),
            self._ev(ended, item_id=item["id"], output_index=idx),
            self._ev("response.output_item.done", output_index=idx, item=item),
        ]

    def _part_done(
        self,
        shape: _Part,
        item_id: str,
        idx: int,
        text: str,
        part: dict[str, Any],
        text_extra: dict[str, Any],
        done_extra: dict[str, Any],
    ) -> list[Event]:
        """The two events that close an item's text part: its text, then the part (``*_extra``:
        the fields one shape adds — a message's logprobs, a summary's status)."""
        seq = self._seq  # the events written out (not through _ev's keywords): every turn closes a part
        self._seq = seq + 2
        index = shape.index_field
        return [
            {
                "type": shape.text_done,
                "sequence_number": seq,
                "item_id": item_id,
                "output_index": idx,
                index: 0,
                "text": text,
                **text_extra,
            },
            {
                "type": shape.done,
                "sequence_number": seq + 1,
                "item_id": item_id,
                "output_index": idx,
                index: 0,
                "part": part,
                **done_extra,
            },
        ]

    def _delta(self, text: str, logprobs: list[dict[str, Any]] | None = None) -> Event | None:
        """The open item's delta event for ``text`` (None: empty text, or hidden reasoning)."""
        if not text:
            return None
        self._text.append(text)
        type_ = self._delta_type
        if type_ is None:
            return None
        seq = self._seq
        self._seq = seq + 1
        index = self._delta_index
        if index is None:  # a tool call's arguments / input
            return {
                "type": type_,
                "sequence_number": seq,
                "item_id": self._open_id,
                "output_index": self._open_idx,
                "delta": text,
            }
        if type_ == _TEXT_DELTA:
            if logprobs:
                self._logprobs += logprobs
            return {
                "type": type_,
                "sequence_number": seq,
                "item_id": self._open_id,
                "output_index": self._open_idx,
                "content_index": 0,
                "delta": text,
                "logprobs": logprobs or [],
            }
        return {
            "type": type_,
            "sequence_number": seq,
            "item_id": self._open_id,
            "output_index": self._open_idx,
            index: 0,
            "delta": text,
        }

    def _close_item(self, complete: bool) -> list[Event]:
        item = self._open
        assert item is not None
        self._open = None
        idx = len(self.output) - 1
        text = "".join(self._text)
        status = "completed" if complete else "incomplete"
        events: list[Event] = []
        t = item["type"]
        if t == "message" and self._cite is not None:
            events += self._cited("", None, final=True)  # what the writer still held
            self._cite = None
            text = "".join(self._text)
        if t == "message" and self._container_files is not None:
            for ann in container_marks(text, self._container_files):
                events.append(
                    self._ev(
                        "response.output_text.annotation.added",
                        item_id=item["id"],
                        output_index=idx,
                        content_index=0,
                        annotation_index=len(self._annotations),
                        annotation=ann,
                    )
                )
                self._annotations.append(ann)
        if t == "message":
            part = _text_part(text, self._logprobs)
            if self._annotations:
                part["annotations"], self._annotations = self._annotations, []
            events += self._part_done(
                _MESSAGE_PART, item["id"], idx, text, part, {"logprobs": list(self._logprobs)}, {}
            )
            item["content"] = [part]
        elif (hosted := kind_of_item(t)) is not None:
            function = self._call_args.get(idx, ("", ""))[0]
            self._call_args[idx] = (function, text)
            if hosted.code:  # the code, whole: a namespace call's JSON streamed nothing, so one delta
                code = code_of(function, text)
                item["code"] = code or ""
                at = {"item_id": item["id"], "output_index": idx}
                if self._delta_type is None and code:
                    events.append(self._ev(hosted.code_event("delta"), **at, delta=code))
                events.append(self._ev(hosted.code_event("done"), **at, code=code or ""))
            if complete:  # runs between engine passes (``gateway.turn.tool_loop``); done after it ran
                self._to_run.append(idx)
                return events
            item["status"] = status
            events.append(self._ev("response.output_item.done", output_index=idx, item=item))
            return events
        elif t == "mcp_call" or t == "mcp_approval_request":
            item["arguments"] = text
            if t == "mcp_call":
                events.append(
                    self._ev("response.mcp_call_arguments.done", item_id=item["id"], output_index=idx, arguments=text)
                )
                if complete:  # runs between engine passes (``gateway.turn.run``); done after it ran
                    self._to_run.append(idx)
                    return events
                item["status"] = status
                item["error"] = gateway_error("The model's call was cut off before its arguments were complete.")
            events.append(self._ev("response.output_item.done", output_index=idx, item=item))
            return events
        elif (kind := call_kind(t)) is not None:
            item[kind.payload] = text
            done = {kind.payload: text, "name": item["name"]} if t == ItemType.FUNCTION_CALL else {kind.payload: text}
            events.append(self._ev(kind.done_event, item_id=item["id"], output_index=idx, **done))
        else:
            shape = _REASONING_PARTS.get(self._reasoning_mode)
            if shape is _REASONING_RAW:
                part = {"type": shape.part_type, "text": text}
                events += self._part_done(shape, item["id"], idx, text, part, {}, {})
                item["content"] = [part]
            elif shape is _REASONING_SUMMARY:
                part = {"type": shape.part_type, "text": text}
                events += self._part_done(
                    shape, item["id"], idx, text, part, {}, {"status": None if complete else "incomplete"}
                )
                item["summary"] = [part]
                item["content"] = [{"type": "reasoning_text", "text": text}]
            else:
                item["content"] = [{"type": "reasoning_text", "text": text}]
            if self._seal is not None:
                item["encrypted_content"] = self._seal(text)
        item["status"] = status
        events.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return events

    # -- terminal -------------------------------------------------------------------------------

    def _terminate(self, status: str, usage: dict[str, Any] | None, **fields: Any) -> list[Event]:
        if self.response["status"] != ResponseStatus.IN_PROGRESS:
            raise IllegalTransition(f"response already {self.response['status']}, cannot become {status}")
        events: list[Event] = []
        if self._open is not None:
            events += self._close_item(complete=False)
        for idx in self.take_calls():  # gateway-run calls that never ran: reported as such
            item = self.output[idx]
            item["status"] = "incomplete"
            if kind_of_item(item["type"]) is None:  # a namespace call's type has no error field
                item["error"] = gateway_error("The response ended before the call ran.")
            events.append(self._ev("response.output_item.done", output_index=idx, item=item))
        self.response["status"] = status
        self.response["usage"] = usage
        self.response.update(fields)
        if status == ResponseStatus.COMPLETED:
            self.response["completed_at"] = int(time.time())
        events.append(self._ev(TERMINAL_EVENT[status], response=self._snapshot()))
        return events

    def complete(self, usage: dict[str, Any]) -> list[Event]:
        return self._terminate(ResponseStatus.COMPLETED, usage)

    def incomplete(self, usage: dict[str, Any], reason: str) -> list[Event]:
        return self._terminate(ResponseStatus.INCOMPLETE, usage, incomplete_details={"reason": reason})

    def fail(self, usage: dict[str, Any] | None, code: str, message: str) -> list[Event]:
        return self._terminate(
            ResponseStatus.FAILED,
            usage,
            error={"code": code, "message": message, "type": "server_error", "param": None, "misalignment": None},
        )

    def withdraw(self, pending: list[Event]) -> list[Event]:
        """Take back a terminal that was built but not sent: the response is in progress again.

        A ``store=true`` response may be reported completed only once it is stored, so its terminal
        is built (the stored snapshot says ``completed``) and held while the store write runs; when
        the write fails — or the turn is cut while waiting — another terminal replaces it. Returns
        ``pending`` without its terminal event (the item events stay, and are sent), and the next
        terminal takes the withdrawn one's sequence number, so the numbers the client sees stay
        dense. Only the last event built can be withdrawn."""
        if (
            not pending
            or pending[-1]["type"] != TERMINAL_EVENT.get(self.response["status"])
            or pending[-1]["sequence_number"] != self._seq - 1
        ):
            raise IllegalTransition("only the terminal event built last, and not sent, can be withdrawn")
        self._seq -= 1
        self.response.update(
            status=ResponseStatus.IN_PROGRESS, usage=None, completed_at=None, error=None, incomplete_details=None
        )
        return pending[:-1]

    def cancel(self, usage: dict[str, Any] | None) -> None:
        """Client went away: the snapshot becomes ``cancelled``; no event is sent (nobody listens)."""
        if self._open is not None:
            self._close_item(complete=False)
        self._terminate(ResponseStatus.CANCELLED, usage)


def late_terminal(response: dict[str, Any], sequence_number: int) -> Event:
    """The terminal event of a response that ended without one being sent, for a client still
    listening: an SSE turn cut by the shutdown deadline (its ``cancelled`` snapshot goes out as
    ``response.failed``, the terminal event of that status), or one cut after it was billed but
    before its terminal was queued. The snapshot is the response as billed and stored."""
    return {
        "type": TERMINAL_EVENT[response["status"]],
        "sequence_number": sequence_number,
        "response": dict(response, output=list(response["output"])),
    }


_TEXT_DELTA = "response.output_text.delta"


class _Part(NamedTuple):
    """How an item streams its text as one part (OpenAI's shapes): the event that opens the part,
    the one that closes its text and the one that closes the part, the index field all three
    carry, and the part's type. One row for each way — a message's output text, raw reasoning, a
    reasoning summary — read by both the opening and the closing of an item, so that the two
    cannot disagree on a shape."""

    added: str
    text_done: str
    done: str
    index_field: str
    part_type: str


_MESSAGE_PART = _Part(
    "response.content_part.added",
    "response.output_text.done",
    "response.content_part.done",
    "content_index",
    "output_text",
)
_REASONING_RAW = _Part(
    "response.content_part.added",
    "response.reasoning_text.done",
    "response.content_part.done",
    "content_index",
    "reasoning_text",
)
_REASONING_SUMMARY = _Part(
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
    "summary_index",
    "summary_text",
)
#: reasoning modes that stream a part (``hidden`` streams none)
_REASONING_PARTS = {"raw": _REASONING_RAW, "summary": _REASONING_SUMMARY}


def _delta_event(item_type: str, reasoning_mode: str) -> tuple[str | None, str | None]:
    """The delta event of an item type: (event type or None for no text events, its index field)."""
    if item_type == ItemType.MESSAGE:
        return _TEXT_DELTA, "content_index"
    kind = call_kind(item_type)
    if kind is not None:
        return kind.delta_event, None
    if reasoning_mode == "raw":
        return "response.reasoning_text.delta", "content_index"
    if reasoning_mode == "summary":
        return "response.reasoning_summary_text.delta", "summary_index"
    return None, None


def gateway_error(message: str) -> dict[str, Any]:
    """An ``mcp_call`` error the gateway itself reports (the call did not run, or not to its end):
    the SDK's ``McpToolCallError`` shape, JSON-RPC's internal-error code."""
    return {"type": "mcp_protocol_error", "code": -32603, "message": message}


def _mcp_call(label: str, name: str, arguments: str = "", approval_request_id: str | None = None) -> dict[str, Any]:
    return {
        "id": new_id("mcp"),
        "type": "mcp_call",
        "status": "in_progress",
        "server_label": label,
        "name": name,
        "arguments": arguments,
        "output": None,
        "error": None,
        "approval_request_id": approval_request_id,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs or ())}
