"""What kopf hands a resource's daemon and handlers, as the operator's code uses it.

Nothing that takes these imports kopf, so a test drives it with a plain object and flag.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol


class LiveResource(Protocol):
    """The resource as its watch keeps it current (kopf's Body)."""

    @property
    def meta(self) -> Mapping[str, Any]: ...
    @property
    def spec(self) -> Mapping[str, Any]: ...
    @property
    def status(self) -> Mapping[str, Any]: ...


class Stopped(Protocol):
    """True once the daemon must stop; ``wait`` sleeps until then or the timeout."""

    def __bool__(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> Awaitable[Any]: ...
