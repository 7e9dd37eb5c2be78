"""HostReleased: the node's host lets go of a GPU before the fabric detaches it.

A surprise removal (the PCIe link going down with the driver bound, a process holding the
device) can hang the host, so the operator asks before each detach (``ReleaseRequested``,
once the device is tainted and no claim holds it) and waits for this plugin's answer. Here:
wait until no process uses the device (the source's ``processes``, NVML's process table),
then run the configured command (``--host-release-command``, e.g. a PCI remove; the
device's UUID and PCI address in its environment), then say ``HostReleased=True``. While a
process holds it, ``HostReleased=False`` says which; the operator shows that and waits.

Written with a field manager of its own: server-side apply drops the fields a manager
leaves out, so one shared with ``DeviceVisible`` would take that condition away.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.conditions import condition, find
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from dra_driver.device_source import DeviceInfo, ProcessesUnknown
from dra_driver.publish_once import PLURAL

MANAGER = "composable-dra-plugin-release"
COMMAND_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class Release:
    """What to do about one resource's release request."""

    resource: str
    uuid: str
    run: bool  # True: no process holds it; run the command, then say released
    released: bool = False  # the answer to write when not ``run``
    reason: str = ""
    message: str = ""


def requested(resource: JSON) -> str | None:
    """The device UUID of a resource whose release is asked for and not yet answered."""
    status = resource.get("status") or {}
    conditions = status.get("conditions")
    asked = (find(conditions, names.RELEASE_REQUESTED) or {}).get("status") == "True"
    done = (find(conditions, names.HOST_RELEASED) or {}).get("status") == "True"
    uuid = status.get("deviceUUID")
    return uuid if asked and not done and isinstance(uuid, str) and uuid else None


def decide_release(resource: str, uuid: str, present: bool, pids: Iterable[int] | None) -> Release:
    """The step for one requested release. ``present``: the node's source lists the device;
    ``pids``: the processes using it (None: the source could not tell)."""
    if not present:
        # Removed from the host already (our command ran before a restart, or by hand).
        return Release(resource, uuid, False, True, "NotOnHost", "the host no longer lists it")
    if pids is None:
        return Release(
            resource, uuid, False, False, "ProcessesUnknown", "cannot read the GPU's processes"
        )
    held = sorted(set(pids))
    if held:
        listed = ", ".join(str(p) for p in held[:10])
        return Release(
            resource, uuid, False, False, "InUse", f"processes use the device (pid {listed})"
        )
    return Release(resource, uuid, True)


def command_failure(exc: OSError | subprocess.SubprocessError) -> str:
    """Why the release command failed, without its arguments (they may carry secrets)."""
    if isinstance(exc, subprocess.CalledProcessError):
        return f"the release command exited with status {exc.returncode}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"the release command did not end within {COMMAND_TIMEOUT_SECONDS} s"
    why = exc.strerror if isinstance(exc, OSError) else None
    return f"the release command could not run: {why or type(exc).__name__}"


class HostReleaser:
    """Answers the node's release requests (see the module docstring). ``processes`` is the
    device source's (None: the source knows no processes, so none is waited for)."""

    def __init__(
        self,
        kube: Kube,
        node: str,
        devices: Callable[[], list[DeviceInfo]],
        refresh: Callable[[], object],
        processes: Callable[[str], list[int]] | None = None,
        command: str | None = None,
    ) -> None:
        self.kube, self.node = kube, node
        self._devices, self._refresh, self._processes = devices, refresh, processes
        self._command = shlex.split(command) if command else None
        self._said: dict[str, tuple[bool, str, str]] = {}
        self._log = logs.get(__name__, node=node)

    def pending(self, resources: Iterable[JSON]) -> bool:
        """Whether a release is asked for and not answered yet (look again soon)."""
        return any(requested(r) and not self._released(r["metadata"]["name"]) for r in resources)

    def _released(self, resource: str) -> bool:
        said = self._said.get(resource)
        return said is not None and said[0]

    def sync(self, resources: Iterable[JSON]) -> None:
        resources = list(resources)
        live = {r["metadata"]["name"] for r in resources}
        self._said = {k: v for k, v in self._said.items() if k in live}
        # Those answered released already are left alone while the watch catches up.
        asked = [
            (r["metadata"]["name"], u)
            for r in resources
            if (u := requested(r)) and not self._released(r["metadata"]["name"])
        ]
        by_uuid = {normalize_uuid(d.uuid): d for d in self._devices()}
        if any(normalize_uuid(u) not in by_uuid for _, u in asked):
            # Not in the last poll: the host may have it by now (an attach that landed
            # since). Only a fresh read may say "not on the host".
            self._refresh()
            by_uuid = {normalize_uuid(d.uuid): d for d in self._devices()}
        for name, uuid in asked:
            device = by_uuid.get(normalize_uuid(uuid))
            step = decide_release(name, uuid, device is not None, self._pids(uuid, device))
            if step.run:
                step = self._run(step, device)
            self._answer(step)

    def _pids(self, uuid: str, device: DeviceInfo | None) -> list[int] | None:
        if device is None or self._processes is None:
            return []
        try:
            return self._processes(device.uuid)
        except ProcessesUnknown as exc:
            self._log.warning("cannot read the GPU's processes", uuid=uuid, error=str(exc))
            return None

    def _run(self, step: Release, device: DeviceInfo | None) -> Release:
        """The release command; its failure is the answer (the detach waits on)."""
        if self._command:
            env = {
                **os.environ,
                "COMPOSABLE_DRA_RESOURCE": step.resource,
                # The source's own form of the UUID (NVML's "GPU-…"), not the fabric's.
                "COMPOSABLE_DRA_DEVICE_UUID": device.uuid if device else step.uuid,
                "COMPOSABLE_DRA_PCI_BUS_ID": (device.pci_bus_id if device else None) or "",
            }
            try:
                subprocess.run(
                    self._command,
                    check=True,
                    timeout=COMMAND_TIMEOUT_SECONDS,
                    capture_output=True,
                    env=env,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                why = command_failure(exc)
                self._log.warning("host release command failed", resource=step.resource, why=why)
                return Release(step.resource, step.uuid, False, False, "ReleaseFailed", why)
            self._refresh()
        how = "ran the host release command" if self._command else "no process uses it"
        return Release(step.resource, step.uuid, False, True, "Released", how)

    def _answer(self, step: Release) -> None:
        said = (step.released, step.reason, step.message)
        if self._said.get(step.resource) == said:
            return
        written = condition(names.HOST_RELEASED, step.released, step.reason, step.message)
        try:
            self.kube.apply(
                path(API_VERSION, PLURAL, step.resource, subresource="status"),
                {
                    "apiVersion": API_VERSION,
                    "kind": "ComposableResource",
                    "metadata": {"name": step.resource},
                    "status": {"conditions": [written]},
                },
                MANAGER,
            )
        except KubeError as exc:
            self._log.warning(
                "could not write HostReleased", resource=step.resource, error=str(exc)
            )
            return
        self._said[step.resource] = said
        self._log.info(
            "host release", resource=step.resource, released=step.released, why=step.reason
        )
