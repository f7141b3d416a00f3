"""OpenAI-shaped errors: one exception type, rendered per transport.

HTTP bodies are ``{"error": {message, type, param, code}}`` with all four keys; WebSocket frames
nest the same object under ``error`` with the HTTP status at the top level; SSE's ``error`` event
is flat. Keeping one exception with status/type/code/param lets the pipeline raise without knowing
which transport will render it.
"""

from __future__ import annotations

import asyncio
from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def sse_event(self, sequence_number: int) -> dict[str, Any]:
        """The flat SSE ``error`` event (no top-level ``error`` key: openai-python would raise on it)."""
        return {
            "type": "error",
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "sequence_number": sequence_number,
        }

    def ws_frame(self, stream_id: str | None = None) -> dict[str, Any]:
        err: dict[str, Any] = {"type": self.type, "code": self.code, "message": self.message, "param": self.param}
        if self.headers:
            err["headers"] = dict(self.headers)
        frame: dict[str, Any] = {"type": "error", "status": self.status, "error": err}
        if stream_id is not None:
            frame["stream_id"] = stream_id
        return frame

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r})"


def bad_request(message: str, *, code: str | None = None, param: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def unknown_parameter(name: str) -> ApiError:
    return bad_request(f"Unknown parameter: '{name}'.", code="unknown_parameter", param=name)


def missing_parameter(name: str) -> ApiError:
    return bad_request(f"Missing required parameter: '{name}'.", code="missing_required_parameter", param=name)


def previous_response_not_found(response_id: str) -> ApiError:
    return bad_request(
        f"Previous response with id '{response_id}' not found.",
        code="previous_response_not_found",
        param="previous_response_id",
    )


def response_not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist or you do not have access to it.", code="model_not_found")


def invalid_api_key() -> ApiError:
    return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")


def store_unavailable() -> ApiError:
    """The shared response store (Redis) is unreachable: retryable, and not a "not found"."""
    return ApiError(
        503,
        "The response store is temporarily unavailable. Please retry your request.",
        type="server_error",
        code="server_is_overloaded",
    )


def server_error(message: str = "The server had an error while processing your request.") -> ApiError:
    return ApiError(500, message, type="server_error", code="server_error")


def shutting_down() -> ApiError:
    """The gateway is shutting down: a create refused while it drains, or a turn cut at its deadline.

    A 503 of type ``server_error``, so SDKs retry it — on another replica, since this one has left
    the load balancer (``/readyz`` answers 503)."""
    return ApiError(
        503, "The server is shutting down. Reconnect to continue.", type="server_error", code="server_shutting_down"
    )  # a string: WebSocketErrorEvent requires one


#: ``shutting_down()`` as a value, for the WebSocket farewell frame (rendered, never raised)
SHUTTING_DOWN = shutting_down()

#: ``response.error.message`` of a ``store=true`` response whose store write failed
#: (``gateway.turn.run``); its code is ``server_error``, the one the SDKs' ``ResponseError`` type
#: allows for a server-side failure (their code is a closed enum: no ``store_unavailable``)
STORE_FAILED_MESSAGE = (
    "The response could not be stored, so it cannot be retrieved or continued with "
    "previous_response_id. Please retry your request."
)

#: exceptions that are control flow, not faults: they always propagate
_CONTROL = (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError)


def is_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault to answer as a failure rather than let propagate.

    Any ``Exception``, and the ``BaseException`` subclasses that native extensions raise for their
    own bugs (pyo3's ``PanicException`` from openai_harmony or tokenizers derives from
    BaseException so that ``except Exception`` does not swallow a Rust panic). Never interpreter
    exits, cancellation or a generator being closed."""
    return not isinstance(exc, _CONTROL)
