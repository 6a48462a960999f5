"""Canonical status codes and the error type used across the emulator.

Codes, names and the HTTP mapping follow absl/TF status codes and TFServing's
model_servers/http_server.cc (ToHTTPStatusCode).
"""

from __future__ import annotations

import enum

import grpc


class Code(enum.IntEnum):
    """absl::StatusCode values."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# http_server.cc ToHTTPStatusCode
_HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


class ServingError(Exception):
    """A non-OK status: a canonical code plus a message."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        # absl::Status::ToString(): "INVALID_ARGUMENT: message"
        return f"{self.code.name}: {self.message}"

    @property
    def http_status(self) -> int:
        """The HTTP status TFServing's REST server answers with for this code."""
        return _HTTP_STATUS.get(self.code, 500)

    @property
    def grpc_code(self) -> grpc.StatusCode:
        """The gRPC status code with the same number."""
        for candidate in grpc.StatusCode:
            if candidate.value[0] == int(self.code):
                return candidate
        return grpc.StatusCode.UNKNOWN


def invalid_argument(message: str) -> ServingError:
    """INVALID_ARGUMENT error."""
    return ServingError(Code.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    """NOT_FOUND error."""
    return ServingError(Code.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    """FAILED_PRECONDITION error."""
    return ServingError(Code.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    """UNAVAILABLE error."""
    return ServingError(Code.UNAVAILABLE, message)


def from_tf_exception(exc: BaseException) -> ServingError:
    """Map a TensorFlow OpError (or anything else) to a ServingError."""
    code = getattr(exc, "error_code", None)
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(code, int) and 0 < code <= 16:
        return ServingError(Code(code), message)
    return ServingError(Code.UNKNOWN, message)
