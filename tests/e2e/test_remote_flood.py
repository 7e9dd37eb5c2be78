"""Issue 25, chaos-style: a peer floods the donor's lease API and its data plane together
(half-sent TLS records and half-sent HELLOs, re-opened as they are cut off) while a good
pod's claim gets its lease from the lease controller, its plugin collects the token, and
its process runs matmul on the donor. The flood comes from a loopback address of its own,
bounded in connections and time (testbed/flood.py); every good client shares 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest

from composable_dra.k8s.kube import path
from testbed.controlplane import free_port
from testbed.flood import Flood, Target
from testbed.realnode import metric_sample
from testbed.wait import wait_for
from tests.e2e.test_remote_lease import RemoteSetup, remote
from tests.e2e.test_remote_pod import phase, workload_pod

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
__all__ = ["remote"]  # the fixture this module uses
RESOURCE = "resource.k8s.io/v1"
LIMITED = "composable_dra_server_limited_total"
TLS_RECORD_HALF = b"\x16\x03\x01\x02"  # a TLS handshake record's header, cut short
HELLO_HALF = b"RGPU"  # a data-plane frame header, cut short


def test_a_flood_of_both_servers_leaves_a_good_pods_lease_working(remote: RemoteSetup) -> None:
    kube, ns = remote.kube, remote.ns
    # The donor again, with its metrics endpoint: what its limits did, and a third server.
    metrics_port = free_port()
    remote.donor_proc.stop()
    remote.donor_proc.args.append(f"--metrics-port={metrics_port}")
    remote.start_donor()
    log = remote.donor_proc.log_path
    logged_before = log.stat().st_size
    targets = [
        Target(("127.0.0.1", remote.api_port), TLS_RECORD_HALF),
        Target(("127.0.0.1", remote.data_port), HELLO_HALF),
        Target(("127.0.0.1", metrics_port), b"GET /metrics HTTP/1.1\r\nHost"),
    ]
    with Flood(targets, per_target=150, seconds=240) as flood:
        wait_for(
            lambda: all(flood.tally.refused.get(t.address) for t in targets[:2]),
            30,
            "the flood to reach the donor's bounds",
            describe=lambda: str(flood.tally),
        )
        pod = workload_pod(kube, ns, "flooded", remote.consumer, ["--size", "128", "--calls", "4"])
        wait_for(
            lambda: phase(kube, ns, "flooded") in ("Succeeded", "Failed"),
            180,
            "the workload pod to finish under the flood",
            describe=lambda: f"{flood.tally}\n{remote.describe()}",
        )
        tally = flood.tally
    assert remote.consumer_kubelet is not None
    out_log = remote.consumer_kubelet.container_log(pod["metadata"]["uid"], "main")
    assert phase(kube, ns, "flooded") == "Succeeded", out_log
    out = json.loads(out_log.strip().splitlines()[-1])
    assert out["ok"] is True and out["where"] == "remote" and out["calls"] == 4
    # The donor refused the flood past its bounds, on each server, and stayed up, quiet.
    for server in ("lease_api", "donor", "metrics"):
        refused = metric_sample(metrics_port, LIMITED, server=server, reason="per_peer")
        assert refused > 0, (server, tally)
    assert remote.donor_proc.alive()
    grown = log.stat().st_size - logged_before
    assert grown < 1 << 20, f"the donor logged {grown} bytes under the flood"
    kube.delete(path("v1", "pods", "flooded", namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", "flooded", namespace=ns))
    wait_for(lambda: remote.leases() == [], 60, "the lease to close", describe=remote.describe)
