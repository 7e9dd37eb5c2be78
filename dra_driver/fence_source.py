"""The manual fence as a health source on the node: the GPUs of this node's fenced
ComposableResources (composable_dra.model.fence) are Quarantined."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from composable_dra.model import fence
from composable_dra.model.health import HealthReport
from composable_dra.model.names import normalize_uuid
from dra_driver.device_source import DeviceInfo


class FenceSource:
    name = "manual"

    def __init__(
        self,
        resources: Callable[[], Iterable[dict[str, Any]]],
        devices: Callable[[], Sequence[DeviceInfo]],
    ) -> None:
        self._resources, self._devices = resources, devices

    def reports(self) -> list[HealthReport]:
        why = fence.fenced(self._resources())
        return [
            fence.report(d.name, why[u])
            for d in self._devices()
            if (u := normalize_uuid(d.uuid)) in why
        ]
