"""A kubelet emulator for fake nodes: the kubelet's DRA side, over the real gRPC sockets.

It does what the kubelet does for DRA and nothing else:
- plugin registration: watches ``plugins_registry`` for sockets, calls GetInfo, picks
  ``v1.DRAPlugin`` over ``v1beta1.DRAPlugin``, and answers NotifyRegistrationStatus;
- pods bound to its node: resolves their ResourceClaims, calls NodePrepareResources on
  each driver named in the allocations, checks that every CDI device ID it gets back
  resolves in a CDI spec on disk (as a container runtime would), and sets the pod
  Running; a failure becomes an Event (reason ``FailedPrepareDynamicResources``) and a
  retry with backoff;
- pod deletion: NodeUnprepareResources once no pod of the node uses a claim any more,
  then the final (grace period 0) delete that a real kubelet sends.

Containers with a ``command`` run as local processes with their CDI edits applied
(``containers``): their exit codes become the pod's phase, and a deleted pod's processes
are stopped before its claims are unprepared. Pods whose containers have no command are
only marked Running; one annotated ``composable.dra.io/emulated-run-seconds: N`` finishes
(phase Succeeded) N seconds after it started, as its workload would.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import grpc

from api.dra.v1 import api_pb2 as dra_v1
from api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from api.dra.v1beta1 import api_pb2 as dra_v1beta1
from api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from composable_dra.k8s import retry
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.k8s.timestamps import now_rfc3339
from composable_dra.process import logs
from testbed.containers import (
    ContainerError,
    Containers,
    cdi_devices,
    pod_status,
    runs_processes,
)

RUN_SECONDS_ANNOTATION = "composable.dra.io/emulated-run-seconds"
# Versions in order of preference, with the modules that speak them.
_VERSIONS: list[tuple[str, Any, Any]] = [
    ("v1.DRAPlugin", dra_v1, dra_v1_grpc),
    ("v1beta1.DRAPlugin", dra_v1beta1, dra_v1beta1_grpc),
]
_RPC_TIMEOUT = 45.0

log = logs.get(__name__)


class PrepareError(Exception):
    """Preparing a pod's claims failed; retried later."""


@dataclass
class Driver:
    name: str
    endpoint: str
    version: str  # "v1" or "v1beta1"
    registration_socket: Path
    channel: grpc.Channel
    stub: Any
    messages: Any


@dataclass(order=True)
class _Due:
    at: float
    key: str = field(compare=False)


def cdi_devices_on_disk(cdi_dir: Path) -> set[str]:
    """Fully qualified CDI device names (vendor/class=name) of the spec files in cdi_dir."""
    return set(cdi_devices(cdi_dir))


def claim_names(pod: JSON) -> list[str] | None:
    """The ResourceClaim names a pod uses; None while a templated claim is not created yet."""
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses", [])
    }
    names = []
    for ref in pod["spec"].get("resourceClaims", []):
        if ref.get("resourceClaimName"):
            names.append(ref["resourceClaimName"])
        elif ref.get("resourceClaimTemplateName"):
            generated = statuses.get(ref["name"])
            if not generated:
                return None
            names.append(generated)
    return names


class KubeletEmulator:
    """The DRA half of a kubelet for one fake node."""

    def __init__(
        self,
        api: Any,
        node_name: str,
        root: Path,
        cdi_dir: Path,
        *,
        retry_max: float = 5.0,
    ) -> None:
        self.kube = api if isinstance(api, Kube) else Kube(api)
        self.node = node_name
        self.root = Path(root)
        self.cdi_dir = Path(cdi_dir)
        self.plugins_registry_dir = self.root / "plugins_registry"
        self.plugins_dir = self.root / "plugins"
        self.retry_max = retry_max
        self._log = log.bind(node=node_name)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._drivers: dict[str, Driver] = {}
        # This node's pods; each added, changed or deleted one is queued for a sync.
        self.pods = Informer(
            self.kube,
            path("v1", "pods"),
            on_event=lambda _type, pod: self._enqueue(_key(pod)),
            name=f"pods-{node_name}",
            watch_timeout=30,
            fieldSelector=f"spec.nodeName={node_name}",
        )
        self._due: list[_Due] = []
        self._attempts: dict[str, int] = {}
        self._claim_users: dict[str, set[str]] = {}  # claim uid -> pod uids on this node
        self._prepared: dict[str, dict[str, list[str]]] = {}  # pod uid -> claim uid -> CDI IDs
        self._prepared_pods: dict[str, JSON] = {}  # key -> the pod as prepared
        self._claim_refs: dict[str, JSON] = {}  # claim uid -> {namespace, name, uid, drivers}
        self._threads: list[threading.Thread] = []
        self._claim_uids: dict[str, dict[str, str]] = {}  # pod uid -> claim name -> uid
        self.containers = Containers(self.root / "pods", self.cdi_dir, self._enqueue, node_name)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        for d in (self.plugins_registry_dir, self.plugins_dir, self.cdi_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.pods.start()
        for target, name in (
            (self._registration_loop, "registration"),
            (self._work_loop, "pod-worker"),
        ):
            t = threading.Thread(target=target, name=f"kubelet-{self.node}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.containers.stop_all()
        with self._wake:
            self._wake.notify_all()
        self.pods.stop()
        for t in self._threads:
            t.join(timeout=5)
        for driver in self._drivers.values():
            driver.channel.close()

    def __enter__(self) -> KubeletEmulator:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- what tests look at ---------------------------------------------------------

    def registered_drivers(self) -> dict[str, str]:
        with self._lock:
            return {name: d.version for name, d in self._drivers.items()}

    def prepared_devices(self, pod_uid: str) -> dict[str, list[str]]:
        """claim UID -> CDI device IDs that the pod's containers would get."""
        with self._lock:
            return {k: list(v) for k, v in self._prepared.get(pod_uid, {}).items()}

    # -- plugin registration ------------------------------------------------------

    def _registration_loop(self) -> None:
        failed: dict[Path, float] = {}
        while not self._stop.is_set():
            present = set(self.plugins_registry_dir.glob("*.sock"))
            with self._lock:
                known = {d.registration_socket: n for n, d in self._drivers.items()}
            for sock, name in known.items():
                if sock not in present:
                    self._deregister(name, "registration socket removed")
            for sock in sorted(present - set(known)):
                if time.monotonic() < failed.get(sock, 0):
                    continue
                if not self._register(sock):
                    failed[sock] = time.monotonic() + 1.0
            self._stop.wait(0.2)  # the kubelet watches the directory; polling it will do here

    def _register(self, sock: Path) -> bool:
        channel = grpc.insecure_channel(f"unix://{sock}")
        try:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        except grpc.RpcError as exc:
            channel.close()
            self._log.info("plugin not answering GetInfo yet", socket=str(sock), error=str(exc))
            return False
        error = ""
        chosen = None
        if info.type != "DRAPlugin":
            error = f"plugin type {info.type!r} is not handled by this kubelet"
        else:
            chosen = next((v for v in _VERSIONS if v[0] in info.supported_versions), None)
            if chosen is None:
                error = f"none of the supported versions {list(info.supported_versions)} is known"
        try:
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=not error, error=error), timeout=5
            )
        except grpc.RpcError as exc:
            self._log.warning("NotifyRegistrationStatus failed", error=str(exc))
        channel.close()
        if error or chosen is None:
            self._log.warning("plugin registration refused", socket=str(sock), error=error)
            return False
        endpoint = info.endpoint or str(sock)
        service_channel = grpc.insecure_channel(f"unix://{endpoint}")
        version_name, messages, grpc_module = chosen
        driver = Driver(
            name=info.name,
            endpoint=endpoint,
            version=version_name.split(".")[0],
            registration_socket=sock,
            channel=service_channel,
            stub=grpc_module.DRAPluginStub(service_channel),
            messages=messages,
        )
        with self._lock:
            old = self._drivers.pop(info.name, None)
            self._drivers[info.name] = driver
            # Pods that waited for this driver get another go right away.
            for key in self.pods.cached_keys():
                heapq.heappush(self._due, _Due(0.0, key))
            self._wake.notify_all()
        if old:
            old.channel.close()
        self._log.info("plugin registered", driver=info.name, version=driver.version)
        return True

    def _deregister(self, name: str, why: str) -> None:
        with self._lock:
            driver = self._drivers.pop(name, None)
        if driver:
            driver.channel.close()
            self._log.info("plugin deregistered", driver=name, reason=why)

    # -- pods ---------------------------------------------------------------------------

    def _enqueue(self, key: str, delay: float = 0.0) -> None:
        with self._wake:
            heapq.heappush(self._due, _Due(time.monotonic() + delay, key))
            self._wake.notify_all()

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while not self._stop.is_set() and (
                    not self._due or self._due[0].at > time.monotonic()
                ):
                    timeout = self._due[0].at - time.monotonic() if self._due else None
                    self._wake.wait(timeout)
                if self._stop.is_set():
                    return
                key = heapq.heappop(self._due).key
            pod = self.pods.get(key)
            try:
                self._sync(key, pod)
                self._attempts.pop(key, None)
            except Exception as exc:
                attempt = self._attempts.get(key, 0) + 1
                self._attempts[key] = attempt
                delay = retry.delay(attempt, cap=self.retry_max)
                if not isinstance(exc, PrepareError | KubeError):
                    self._log.exception("pod sync failed", pod=key)
                self._enqueue(key, delay)

    def _sync(self, key: str, pod: JSON | None) -> None:
        if pod is None:
            # Gone from the API (force-deleted, or its node's finalizing delete went
            # through): like the kubelet, still unprepare what it had prepared.
            with self._lock:
                known = self._prepared_pods.get(key)
            if known is not None:
                self.containers.stop(known["metadata"]["uid"])
                self._release(known)
            return
        uid = pod["metadata"]["uid"]
        phase = pod.get("status", {}).get("phase", "Pending")
        if pod["metadata"].get("deletionTimestamp"):
            self.containers.stop(uid)
            self._release(pod)
            self.kube.delete(
                path("v1", "pods", pod["metadata"]["name"], namespace=pod["metadata"]["namespace"]),
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
            return
        if phase in ("Succeeded", "Failed"):
            self._release(pod)
            return
        with self._lock:
            prepared = uid in self._prepared
        if not prepared:
            self._prepare(pod)
        if runs_processes(pod):
            self._run_containers(pod)
            return
        if phase != "Running":
            self._set_running(pod)
        self._maybe_finish(key, pod)

    def _prepare(self, pod: JSON) -> None:
        meta = pod["metadata"]
        names = claim_names(pod)
        if names is None:
            raise PrepareError("a templated ResourceClaim is not created yet")
        # driver -> claims to prepare with it
        by_driver: dict[str, list[JSON]] = {}
        for name in names:
            claim = self.kube.get_or_none(
                path("resource.k8s.io/v1", "resourceclaims", name, namespace=meta["namespace"])
            )
            if claim is None:
                raise PrepareError(f"ResourceClaim {name} not found")
            status = claim.get("status", {})
            reserved = {r.get("uid") for r in status.get("reservedFor", [])}
            if not status.get("allocation") or meta["uid"] not in reserved:
                raise PrepareError(f"ResourceClaim {name} is not allocated and reserved for pod")
            drivers = {r["driver"] for r in status["allocation"]["devices"].get("results", [])}
            ref = {
                "namespace": meta["namespace"],
                "name": name,
                "uid": claim["metadata"]["uid"],
                "drivers": sorted(drivers),
            }
            for d in drivers:
                by_driver.setdefault(d, []).append(ref)
        results: dict[str, list[str]] = {}
        for driver_name, claims in sorted(by_driver.items()):
            with self._lock:
                driver = self._drivers.get(driver_name)
            if driver is None:
                self._fail(pod, f"DRA driver {driver_name} is not registered")
            msg = driver.messages
            request = msg.NodePrepareResourcesRequest(
                claims=[
                    msg.Claim(namespace=c["namespace"], name=c["name"], uid=c["uid"])
                    for c in claims
                ]
            )
            try:
                response = driver.stub.NodePrepareResources(request, timeout=_RPC_TIMEOUT)
            except grpc.RpcError as exc:
                self._fail(pod, f"NodePrepareResources of {driver_name} failed: {exc}")
            on_disk = cdi_devices_on_disk(self.cdi_dir)
            for c in claims:
                entry = response.claims.get(c["uid"])
                if entry is None:
                    self._fail(pod, f"{driver_name} returned no result for claim {c['name']}")
                if entry.error:
                    self._fail(
                        pod, f"{driver_name} failed to prepare claim {c['name']}: {entry.error}"
                    )
                ids = [cdi for dev in entry.devices for cdi in dev.cdi_device_ids]
                missing = [cdi for cdi in ids if cdi not in on_disk]
                if missing:
                    self._fail(
                        pod,
                        f"CDI devices {missing} of claim {c['name']} are not "
                        f"in any CDI spec under {self.cdi_dir}",
                    )
                results.setdefault(c["uid"], []).extend(ids)
        with self._lock:
            self._prepared[meta["uid"]] = results
            self._claim_uids[meta["uid"]] = {
                c["name"]: c["uid"] for by in by_driver.values() for c in by
            }
            self._prepared_pods[f"{meta['namespace']}/{meta['name']}"] = pod
            for by in by_driver.values():
                for c in by:
                    self._claim_users.setdefault(c["uid"], set()).add(meta["uid"])
                    self._claim_refs[c["uid"]] = c
        devices = sorted({i for ids in results.values() for i in ids})
        self._event(
            pod,
            "Normal",
            "PreparedDynamicResources",
            f"claims prepared; CDI devices: {', '.join(devices) or 'none'}",
        )

    def _fail(self, pod: JSON, message: str) -> NoReturn:
        self._event(pod, "Warning", "FailedPrepareDynamicResources", message)
        raise PrepareError(message)

    def _release(self, pod: JSON) -> None:
        """Unprepare the pod's claims that no other pod of this node still uses."""
        uid = pod["metadata"]["uid"]
        with self._lock:
            if uid not in self._prepared:
                return
            claim_uids = list(self._prepared[uid])
            last = [
                self._claim_refs[c] for c in claim_uids if self._claim_users.get(c, set()) <= {uid}
            ]
        by_driver: dict[str, list[JSON]] = {}
        for ref in last:
            for d in ref["drivers"]:
                by_driver.setdefault(d, []).append(ref)
        for driver_name, claims in sorted(by_driver.items()):
            with self._lock:
                driver = self._drivers.get(driver_name)
            if driver is None:
                raise PrepareError(f"DRA driver {driver_name} is not registered for unprepare")
            msg = driver.messages
            response = driver.stub.NodeUnprepareResources(
                msg.NodeUnprepareResourcesRequest(
                    claims=[
                        msg.Claim(namespace=c["namespace"], name=c["name"], uid=c["uid"])
                        for c in claims
                    ]
                ),
                timeout=_RPC_TIMEOUT,
            )
            errors = {u: r.error for u, r in response.claims.items() if r.error}
            missing = [c["uid"] for c in claims if c["uid"] not in response.claims]
            if errors or missing:
                message = f"unprepare failed: {errors or ''} {missing or ''}".strip()
                self._event(pod, "Warning", "FailedUnprepareDynamicResources", message)
                raise PrepareError(message)
        with self._lock:
            self._prepared.pop(uid, None)
            self._claim_uids.pop(uid, None)
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            if self._prepared_pods.get(key, {}).get("metadata", {}).get("uid") == uid:
                self._prepared_pods.pop(key)
            for c in claim_uids:
                users = self._claim_users.get(c, set())
                users.discard(uid)
                if not users:
                    self._claim_users.pop(c, None)
                    self._claim_refs.pop(c, None)

    def _set_running(self, pod: JSON) -> None:
        meta = pod["metadata"]
        started = now_rfc3339()
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": started}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
                "PodScheduled",
            )
        ]
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"emulated://{uuid.uuid4().hex}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for c in pod["spec"].get("containers", [])
        ]
        self.kube.merge_patch(
            path("v1", "pods", meta["name"], namespace=meta["namespace"], subresource="status"),
            {
                "metadata": {"uid": meta["uid"]},
                "status": {
                    "phase": "Running",
                    "hostIP": "127.0.0.1",
                    "podIP": "127.0.0.1",
                    "startTime": started,
                    "conditions": conditions,
                    "containerStatuses": containers,
                },
            },
        )

    def _run_containers(self, pod: JSON) -> None:
        """Start the pod's container processes once; report their state as the pod's."""
        meta = pod["metadata"]
        if not self.containers.started(meta["uid"]):
            with self._lock:
                uids = dict(self._claim_uids.get(meta["uid"], {}))
                prepared = dict(self._prepared.get(meta["uid"], {}))
            refs = pod["spec"].get("resourceClaims", [])
            devices = {
                ref["name"]: prepared.get(uids.get(name, ""), [])
                for ref, name in zip(refs, claim_names(pod) or [], strict=False)
            }
            try:
                self.containers.start(pod, devices)
            except (ContainerError, OSError) as exc:
                self._event(pod, "Warning", "Failed", f"cannot start containers: {exc}")
                raise PrepareError(str(exc)) from exc
        state = self.containers.status(meta["uid"])
        if state is None:
            return
        phase, statuses = state
        current = pod.get("status", {})
        if current.get("phase") == phase and current.get("containerStatuses") == statuses:
            return
        started = current.get("startTime") or now_rfc3339()
        self.kube.merge_patch(
            path("v1", "pods", meta["name"], namespace=meta["namespace"], subresource="status"),
            {"metadata": {"uid": meta["uid"]}, "status": pod_status(phase, statuses, started)},
        )

    def container_log(self, pod_uid: str, container: str) -> str:
        """What a container process of the pod printed so far."""
        return self.containers.log(pod_uid, container)

    def _maybe_finish(self, key: str, pod: JSON) -> None:
        seconds = pod["metadata"].get("annotations", {}).get(RUN_SECONDS_ANNOTATION)
        if seconds is None:
            return
        start = pod.get("status", {}).get("startTime")
        if not start:
            self._enqueue(key, float(seconds))  # started just now; check again then
            return
        started = datetime.datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC
        )
        left = float(seconds) - (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        if left > 0:
            self._enqueue(key, left)
            return
        meta = pod["metadata"]
        finished = now_rfc3339()
        self.kube.merge_patch(
            path("v1", "pods", meta["name"], namespace=meta["namespace"], subresource="status"),
            {
                "metadata": {"uid": meta["uid"]},
                "status": {
                    "phase": "Succeeded",
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "PodCompleted",
                            "lastTransitionTime": finished,
                        }
                    ],
                    "containerStatuses": [
                        {
                            "name": c["name"],
                            "image": c.get("image", ""),
                            "imageID": "",
                            "ready": False,
                            "started": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": 0,
                                    "reason": "Completed",
                                    "finishedAt": finished,
                                }
                            },
                        }
                        for c in pod["spec"].get("containers", [])
                    ],
                },
            },
        )

    def _event(self, pod: JSON, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = now_rfc3339()
        body = {
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1000],
            "type": kind,
            "source": {"component": "kubelet", "host": self.node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self.node,
        }
        try:
            self.kube.create(path("v1", "events", namespace=meta["namespace"]), body)
        except KubeError as exc:
            self._log.warning("could not record event", reason=reason, error=str(exc))
        (self._log.warning if kind == "Warning" else self._log.info)(
            message, pod=f"{meta['namespace']}/{meta['name']}", reason=reason
        )


def _key(pod: JSON) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def main(argv: list[str] | None = None) -> int:
    """Run one emulator as a process: python -m testbed.kubelet_emulator."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--root-dir", required=True, type=Path)
    parser.add_argument("--cdi-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logs.configure("kubelet-emulator")
    emulator = KubeletEmulator(
        Kube.from_config(args.kubeconfig), args.node_name, args.root_dir, args.cdi_dir
    )
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    emulator.start()
    stop.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
