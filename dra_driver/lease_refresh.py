"""Re-opened leases reach the running containers: the plugin's side of a donor restart.

When a donor restarts, the lease controller opens the lease of each allocation it held
again (``device_scaler/leases.py``) and writes the new lease into the claim's status.
Every ``interval`` seconds this loop reads the claims prepared here that have remote
devices; where a claim names another ready lease than the one prepared
(``remote_prepare.stale_leases``), the plugin collects the new lease's token and writes it
with the endpoint into the device's directory, which the container has mounted
(``Preparer.refresh_remote``). The client in the container reconnects with those files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from composable_dra.process import logs
from dra_driver import metrics
from dra_driver.checkpoint import ClaimRecord
from dra_driver.prepared_remote import ClaimRead, remote_claims
from dra_driver.remote_prepare import RemoteClaimError, RemotePlanned, stale_leases

log = logs.get(__name__)


class LeaseRefresher:
    """``claims``: the claims prepared here; ``read``: a claim (namespace, name) from the
    API; ``refresh``: ``Preparer.refresh_remote``; a pass every ``interval`` seconds."""

    def __init__(
        self,
        driver: str,
        claims: Callable[[], Iterable[ClaimRecord]],
        read: ClaimRead,
        refresh: Callable[[str, Sequence[RemotePlanned]], bool],
        interval: float = 2.0,
    ) -> None:
        self._driver, self._claims, self._read, self._refresh = driver, claims, read, refresh
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh_once(self) -> int:
        """One pass; how many leases were refreshed."""
        done = 0
        for record, claim in remote_claims(self._claims(), self._read):
            stale = stale_leases(record.devices, claim, self._driver)
            if stale:
                done += self._apply(record, stale)
        return done

    def _apply(self, record: ClaimRecord, stale: Sequence[RemotePlanned]) -> int:
        try:
            refreshed = self._refresh(record.uid, stale)
        except RemoteClaimError as exc:
            # Tried again on the next pass: the donor may not have the lease yet.
            metrics.LEASE_REFRESHES.labels("error").inc(len(stale))
            log.warning("cannot refresh a re-opened lease", uid=record.uid, error=str(exc))
            return 0
        if refreshed:
            metrics.LEASE_REFRESHES.labels("ok").inc(len(stale))
        return len(stale) if refreshed else 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lease-refresh", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh_once()
            except Exception as exc:  # an API failure must not end the loop
                log.warning("lease refresh pass failed", error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
