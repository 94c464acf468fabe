"""One error tree for every microco service.

Each error type knows its gRPC status code and its HTTP status. Servicers raise these;
``ErrorInterceptor`` turns them into gRPC status codes (never a stack trace on the wire);
clients turn a ``grpc.RpcError`` back into the same type with ``from_rpc_error`` through
one closed table, so callers catch ``NotFound`` rather than inspecting codes.
"""

from __future__ import annotations

import grpc

#: The longest message an error carries. Messages often quote a request's values (an id, a
#: name); a request of megabytes must not come back as megabytes of error, nor overflow gRPC's
#: metadata limit (8 KiB by default), which turns the answer into an opaque INTERNAL.
MAX_MESSAGE_CHARS = 1024


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to at most about ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class MicrocoError(Exception):
    """Base of every error microco raises on purpose. Its message is bounded
    (:data:`MAX_MESSAGE_CHARS`), so whatever it quotes, it fits an answer."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    http_status: int = 500

    def __init__(self, message: str = "") -> None:
        message = bounded(message)
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message or self.__class__.__name__


class InvalidArgument(MicrocoError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class NotFound(MicrocoError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class AlreadyExists(MicrocoError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class FailedPrecondition(MicrocoError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 412


class Aborted(MicrocoError):
    """A conflict (e.g. a lost compare-and-swap); the caller may retry the whole operation."""

    grpc_code = grpc.StatusCode.ABORTED
    http_status = 409


class PermissionDenied(MicrocoError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class Unauthenticated(MicrocoError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class ResourceExhausted(MicrocoError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429


class Unavailable(MicrocoError):
    """The service or a dependency cannot be reached now; safe to retry idempotent calls."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


class DeadlineExceeded(MicrocoError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


class Cancelled(MicrocoError):
    grpc_code = grpc.StatusCode.CANCELLED
    http_status = 499


class Internal(MicrocoError):
    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500


class Unimplemented(MicrocoError):
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    http_status = 501


_BY_CODE: dict[grpc.StatusCode, type[MicrocoError]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        Aborted,
        PermissionDenied,
        Unauthenticated,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        Internal,
        Unimplemented,
    )
}


def error_for_code(code: grpc.StatusCode, message: str) -> MicrocoError:
    """The microco error for a gRPC status code (``MicrocoError`` itself for codes outside the table)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = MicrocoError(message)
        err.grpc_code = code
        return err
    return cls(message)


def from_rpc_error(exc: grpc.RpcError) -> MicrocoError:
    """Map a client-side ``grpc.RpcError`` back to the error type the server raised."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return error_for_code(code, details or code.name)
