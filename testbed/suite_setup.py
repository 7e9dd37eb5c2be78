"""The objects a suite creates before its components start, and its components' flags.

Pure: each function builds a body or an argument list from the suite's options.
"""

from __future__ import annotations

import base64

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON
from fabric_emulator import topology as emulator_topology
from fabric_emulator.testing import EmulatorProcess
from testbed.suite_options import SuiteOptions

CREDENTIALS = "fabric-credentials"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def credentials_secret(opts: SuiteOptions, emulator: EmulatorProcess) -> JSON:
    """The Fabric's credentials: the emulator's user, and the Fsas FM client if it has one."""
    data = {"username": _b64(emulator.user), "password": _b64(emulator.password)}
    if fsas := opts.fsas:
        data |= {"client_id": _b64(fsas.client_id), "client_secret": _b64(fsas.client_secret)}
    return {"metadata": {"name": CREDENTIALS}, "data": data}


def backend(opts: SuiteOptions) -> JSON:
    """The Fabric's backend fields: Redfish, or the Fsas FM (SuiteOptions.fsas)."""
    fsas = opts.fsas
    if fsas is None:
        return {"backend": "redfish-composition"}
    settings: JSON = {"tenantUUID": fsas.tenant, "realm": fsas.realm}
    if fsas.attach_by_model:
        raw = opts.topology
        topology = emulator_topology.parse(raw) if raw else emulator_topology.default()
        models = sorted({b.model for b in topology.blocks.values()})
        settings |= {"attachBy": "model", "models": models}
    return {"backend": "fsas-fm", "fsas": settings}


def fabric(name: str, opts: SuiteOptions, endpoint: str, namespace: str) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": "Fabric",
        "metadata": {"name": name},
        "spec": {
            **backend(opts),
            "endpoint": endpoint,
            "credentialsSecret": {"name": CREDENTIALS, "namespace": namespace},
            "pollIntervalSeconds": opts.poll_interval_seconds,
            "operationTimeoutSeconds": max(10, int(opts.attach_timeout)),
        },
    }


def attach_latency(seconds: float) -> JSON:
    """The emulator's fault rule that slows each composition request by ``seconds``."""
    return {
        "kind": "latency",
        "method": "POST|PATCH",
        "path": "ResourceBlock|/Systems/",
        "latency": seconds,
    }


def _leader_election(opts: SuiteOptions, namespace: str) -> list[str]:
    return [
        f"--leader-elect-namespace={namespace}",
        f"--leader-elect-lease-duration={opts.lease_duration}",
        f"--leader-elect-renew-deadline={max(2, opts.lease_duration - 1)}",
        "--leader-elect-retry-period=1",
    ]


def operator_args(opts: SuiteOptions, kubeconfig: str, namespace: str) -> list[str]:
    election = (
        [f"--leader-elect-namespace={namespace}"]
        if opts.leader_elect_operator
        else ["--no-leader-elect"]
    )
    return [f"--kubeconfig={kubeconfig}", "--metrics-port=0", *opts.operator_args, *election]


def publisher_args(opts: SuiteOptions, kubeconfig: str, namespace: str) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        *_leader_election(opts, namespace),
        *opts.publisher_args,
    ]


def scaler_args(opts: SuiteOptions, kubeconfig: str, namespace: str) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        *_leader_election(opts, namespace),
        f"--no-removal-duration={opts.no_removal}",
        f"--attach-timeout={opts.attach_timeout}",
        f"--failure-quarantine={opts.quarantine}",
        "--resync=0.5",
        *opts.scaler_args,
    ]
