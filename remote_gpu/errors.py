"""Typed errors: the codes an ERROR frame carries and the exceptions the client raises."""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    BAD_FRAME = "bad_frame"
    UNSUPPORTED_VERSION = "unsupported_version"
    AUTH_FAILED = "auth_failed"
    LEASE_BUSY = "lease_busy"
    NOT_ALLOWED = "not_allowed"
    MEMORY_QUOTA = "memory_quota"
    RATE_LIMITED = "rate_limited"
    FLOW_CONTROL = "flow_control"
    ADMISSION_REFUSED = "admission_refused"
    FUNCTION_FAILED = "function_failed"
    WORKER_DIED = "worker_died"
    BAD_SEQUENCE = "bad_sequence"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL = "internal"
    # The client's own (no donor sends them): a lost connection (remote_gpu.reconnect).
    CALL_INTERRUPTED = "call_interrupted"
    RECONNECT_FAILED = "reconnect_failed"


class RemoteGPUError(Exception):
    """Base of every error the remote GPU service reports.

    A subclass names its code as a class keyword (``class X(RemoteGPUError,
    code=Code.Y)``); that also registers it as the exception :func:`from_code` raises
    for the code."""

    code: Code = Code.INTERNAL

    def __init_subclass__(cls, code: Code | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            _BY_CODE[code] = cls

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message


_BY_CODE: dict[Code, type[RemoteGPUError]] = {}


class FrameError(RemoteGPUError, code=Code.BAD_FRAME): ...


class SequenceError(FrameError, code=Code.BAD_SEQUENCE):
    """A request's sequence number does not follow the previous one's: replayed or out
    of order."""


class DeadlineExceeded(RemoteGPUError, TimeoutError, code=Code.DEADLINE_EXCEEDED):
    """No answer in time (also a :class:`TimeoutError`)."""


class VersionError(RemoteGPUError, code=Code.UNSUPPORTED_VERSION): ...


class AuthError(RemoteGPUError, code=Code.AUTH_FAILED): ...


class LeaseBusy(RemoteGPUError, code=Code.LEASE_BUSY): ...


class NotAllowed(RemoteGPUError, code=Code.NOT_ALLOWED): ...


class MemoryQuotaExceeded(RemoteGPUError, code=Code.MEMORY_QUOTA): ...


class RateLimited(RemoteGPUError, code=Code.RATE_LIMITED): ...


class FlowControlError(RemoteGPUError, code=Code.FLOW_CONTROL): ...


class AdmissionRefused(RemoteGPUError, code=Code.ADMISSION_REFUSED): ...


class FunctionFailed(RemoteGPUError, code=Code.FUNCTION_FAILED): ...


class WorkerDied(RemoteGPUError, code=Code.WORKER_DIED): ...


class CallInterrupted(RemoteGPUError, code=Code.CALL_INTERRUPTED):
    """The connection was lost while the call was in flight, and its function is not
    declared idempotent: it may or may not have run on the donor, so it is not run again.
    The lease's next call reconnects."""


class ReconnectFailed(RemoteGPUError, code=Code.RECONNECT_FAILED):
    """No new connection to the lease within the client's bound (the donor did not come
    back, or its lease was not re-opened)."""


class Fatal(Exception):
    """A defect in a peer's frames that ends its connection (donor and worker side): the
    code and message its ERROR frame carries, for the request ``seq``."""

    def __init__(self, code: Code, message: str, seq: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq


def from_code(code: str, message: str) -> RemoteGPUError:
    """The exception for an ERROR frame's code; unknown codes become the base class."""
    try:
        known = Code(code)
    except ValueError:
        return RemoteGPUError(f"{code}: {message}")
    return _BY_CODE.get(known, RemoteGPUError)(message, known)
