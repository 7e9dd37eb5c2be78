"""The typed fabric errors a backend raises: what went wrong, whether a retry may help
(``retryable``), and the label of the fabric_errors metric (``kind``)."""

from __future__ import annotations


class FabricError(Exception):
    """Base of the typed fabric errors; ``kind`` labels the fabric_errors metric."""

    kind = "failed"
    retryable = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotFoundError(FabricError):
    kind = "not_found"


class InUseError(FabricError):
    """The device is attached elsewhere, or is being changed by someone else."""

    kind = "in_use"


class InsufficientError(FabricError):
    """The fabric has no capacity for the request."""

    kind = "insufficient"


class BusyError(FabricError):
    """The fabric manager asks to come back later (503, Retry-After)."""

    kind = "busy"
    retryable = True


class AuthError(FabricError):
    kind = "auth"


class TransientError(FabricError):
    """Network trouble or a server error: the outcome of a change is unknown."""

    kind = "transient"
    retryable = True


class BadAnswerError(FabricError):
    """The fabric answered something that cannot be read or trusted: malformed or too
    deep JSON, another shape than the API's, an answer too large or a wait of days."""

    kind = "bad_answer"
    retryable = True


class OperationFailedError(FabricError):
    """The fabric ran the operation and reports that it failed."""

    kind = "failed"
    retryable = True
