"""What kube-proxy would write for a Service a test needs, on the real nodes.

The local cluster runs no kube-proxy (testbed.node_network says why), so a Service's
ClusterIP leads nowhere in a node's network namespace. For a Service whose pods run on
real nodes (the chart's fabric emulator), :func:`route_service` reads the Service and its
EndpointSlices once a ready endpoint is published, as kube-proxy does, and writes the
same kind of rules into every node's namespace: the ClusterIP and port sent to the
endpoint's pod address (DNAT, for the node's pods and its own processes), and what is
sent there masqueraded, so that the answer comes back through the node that translated
it even when the endpoint is on the same bridge. One endpoint, fixed once written: a
restarted endpoint pod is not followed (kube-proxy would); the rules go with the node's
namespace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from composable_dra.k8s.kube import JSON, Kube, path
from testbed.realnode import RealNode
from testbed.wait import wait_for


@dataclass(frozen=True)
class ServiceRoute:
    """A Service's address and port, and the pod address and port that serve them."""

    cluster_ip: str
    port: int
    endpoint_ip: str
    target_port: int


def route_of(service: JSON, slices: Sequence[JSON]) -> ServiceRoute | None:
    """The route of the Service's first TCP port to its first ready endpoint; None while
    no endpoint is ready or the Service has no address (headless)."""
    spec = service["spec"]
    cluster_ip = spec.get("clusterIP")
    ports = [p for p in spec.get("ports", []) if p.get("protocol", "TCP") == "TCP"]
    if not cluster_ip or cluster_ip == "None" or not ports:
        return None
    name = ports[0].get("name", "")
    for s in slices:
        target = next((p["port"] for p in s.get("ports") or [] if p.get("name", "") == name), None)
        for endpoint in s.get("endpoints") or []:
            if target is not None and endpoint.get("conditions", {}).get("ready"):
                return ServiceRoute(cluster_ip, ports[0]["port"], endpoint["addresses"][0], target)
    return None


def nat_commands(route: ServiceRoute) -> list[list[str]]:
    """The rules for ``route`` in a node's namespace: DNAT from its pods (PREROUTING) and
    its own processes (OUTPUT); masquerade what was translated to the endpoint."""
    to = f"{route.endpoint_ip}:{route.target_port}"
    match = ["-d", route.cluster_ip, "-p", "tcp", "--dport", str(route.port)]
    dnat = [*match, "-j", "DNAT", "--to-destination", to]
    back = ["-d", route.endpoint_ip, "-p", "tcp", "--dport", str(route.target_port)]
    nat = ["iptables", "-t", "nat", "-A"]
    return [
        [*nat, "PREROUTING", *dnat],
        [*nat, "OUTPUT", *dnat],
        [*nat, "POSTROUTING", *back, "-m", "conntrack", "--ctstate", "DNAT", "-j", "MASQUERADE"],
    ]


def route_service(
    kube: Kube, nodes: Sequence[RealNode], namespace: str, name: str, timeout: float = 120
) -> ServiceRoute:
    """Once the Service ``namespace/name`` has a ready endpoint, route it on ``nodes``."""

    def ready() -> ServiceRoute | None:
        for node in nodes:
            node.check_alive()
        service = kube.get_or_none(path("v1", "services", name, namespace=namespace))
        if service is None:
            return None
        slices = kube.get(
            path("discovery.k8s.io/v1", "endpointslices", namespace=namespace),
            labelSelector=f"kubernetes.io/service-name={name}",
        )["items"]
        return route_of(service, slices)

    route = wait_for(ready, timeout, f"a ready endpoint of Service {namespace}/{name}")
    for node in nodes:
        for argv in nat_commands(route):
            node.in_namespace(argv)
    return route
