"""The kubelet's ``DRAResourceHealth.NodeWatchResources`` stream (dra-health v1 and
v1alpha1): the health of every device this plugin published or prepared.

A local device is named in the node's pool; a pool GPU attached here keeps the identity
its claim was allocated with (the fabric pool and the pool device), so the kubelet finds
it in the claim's allocation and shows it in the pod's ``allocatedResourcesStatus``. The
kubelet calls a device Unknown after its timeout without an update: every stream sends
the whole picture at once, on each change, and again every ``resend`` seconds (the
plugin's ``--health-resend``), with a timeout of three resends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from api.dra_health.v1 import api_pb2 as health_v1
from api.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from api.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from api.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from composable_dra.model.health import Health, HealthReport, remote_key
from composable_dra.process import logs
from dra_driver.checkpoint import PreparedDevice

SERVICES = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
RESEND = 10.0  # seconds, by default; the timeout sent is three of them
MAX_STREAMS = 2  # the kubelet opens one; a rolling update's reconnect may overlap it
_MESSAGE = 1024


@dataclass(frozen=True)
class Entry:
    pool: str
    device: str
    report: HealthReport


def entries(
    node_pool: str,
    published: Iterable[str],
    states: Mapping[str, HealthReport],
    prepared: Iterable[PreparedDevice],
) -> list[Entry]:
    """Every device the kubelet may ask about, with its state: each published one in the
    node's pool (Healthy unless a source says otherwise), each prepared one under its
    allocated identity (Unknown when no source knows its local device any more)."""
    out: dict[tuple[str, str], Entry] = {}
    for name in published:
        report = states.get(name) or HealthReport(name, Health.HEALTHY)
        out[(node_pool, name)] = Entry(node_pool, name, report)
    for dev in prepared:
        if dev.remote is not None:
            # Its donor's to judge (donor_health); none said: nothing is claimed for it.
            remote = states.get(remote_key(dev.pool_name, dev.device_name))
            if remote is not None:
                out[(dev.pool_name, dev.device_name)] = Entry(
                    dev.pool_name, dev.device_name, remote
                )
            continue
        report = states.get(dev.local_name) or HealthReport(dev.local_name, Health.UNKNOWN)
        out[(dev.pool_name, dev.device_name)] = Entry(dev.pool_name, dev.device_name, report)
    return [out[k] for k in sorted(out)]


def timeout_for(resend: float) -> int:
    """The kubelet's timeout for a stream resent every ``resend`` seconds: three resends,
    so one late or lost resend never reads Unknown."""
    return max(1, math.ceil(3 * resend))


def response(api: ModuleType, found: Iterable[Entry], now: float, timeout: int) -> Any:
    """A NodeWatchResourcesResponse in ``api``'s messages (v1 or v1alpha1)."""
    resp = api.NodeWatchResourcesResponse()
    for e in found:
        message = e.report.reason.value if e.report.reason else ""
        if e.report.message:
            message = f"{message}: {e.report.message}" if message else e.report.message
        resp.devices.add(
            device=api.DeviceIdentifier(pool_name=e.pool, device_name=e.device),
            health=getattr(api, e.report.health.name),
            last_updated_time=int(now),
            health_check_timeout_seconds=timeout,
            message=message[:_MESSAGE],
        )
    return resp


class HealthFeed:
    """What the streams send, and a version that every change moves on."""

    def __init__(self, snapshot: Callable[[], list[Entry]]) -> None:
        self.snapshot = snapshot
        self._cond = threading.Condition()
        self._version = 0
        self._streams = 0
        self.stopped = False

    def changed(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def version(self) -> int:
        with self._cond:
            return self._version

    def wait(self, seen: int, timeout: float) -> int:
        """The version once it moved past ``seen``, or after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen or self.stopped, timeout)
            return self._version

    def open_stream(self) -> bool:
        with self._cond:
            if self._streams >= MAX_STREAMS:
                return False
            self._streams += 1
            return True

    def close_stream(self) -> None:
        with self._cond:
            self._streams -= 1


class Cursor:
    """One stream's place in the feed: what version it sent last."""

    def __init__(self, feed: HealthFeed) -> None:
        self._feed = feed
        self._seen = feed.version()

    def next(self, timeout: float) -> None:
        """Until the feed changed since the last call, or ``timeout``."""
        self._seen = self._feed.wait(self._seen, timeout)


class HealthStreamServicer(
    health_v1_grpc.DRAResourceHealthServicer, health_v1alpha1_grpc.DRAResourceHealthServicer
):
    """NodeWatchResources in one API version's messages."""

    def __init__(self, feed: HealthFeed, api: ModuleType, resend: float = RESEND) -> None:
        self._feed, self._api, self._resend = feed, api, resend
        self._timeout = timeout_for(resend)
        self._log = logs.get(__name__)

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        if not self._feed.open_stream():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many health streams")
        self._log.info("health stream opened", api=self._api.__name__)
        try:
            cursor = Cursor(self._feed)
            while context.is_active() and not self._feed.stopped:
                yield response(self._api, self._feed.snapshot(), time.time(), self._timeout)
                cursor.next(self._resend)
        finally:
            self._feed.close_stream()
            self._log.info("health stream closed")


def add_to_server(feed: HealthFeed, server: grpc.Server, resend: float = RESEND) -> None:
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthStreamServicer(feed, health_v1, resend), server
    )
    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthStreamServicer(feed, health_v1alpha1, resend), server
    )
