"""testbed.service_routes: a Service's route from its EndpointSlices, and its rules."""

from __future__ import annotations

from typing import Any

from testbed.service_routes import ServiceRoute, nat_commands, route_of


def service(cluster_ip: str = "10.0.0.80", protocol: str = "TCP") -> dict[str, Any]:
    port = {"name": "redfish", "port": 8000, "targetPort": "redfish", "protocol": protocol}
    return {"spec": {"clusterIP": cluster_ip, "ports": [port]}}


def endpoint_slice(ready: bool, address: str = "10.232.1.5", port: str = "redfish") -> Any:
    return {
        "ports": [{"name": port, "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}],
    }


def test_the_first_ready_endpoint_serves_the_service_port() -> None:
    slices = [endpoint_slice(False, "10.232.1.4"), endpoint_slice(True, "10.232.2.7")]
    assert route_of(service(), slices) == ServiceRoute("10.0.0.80", 8000, "10.232.2.7", 8000)


def test_no_route_without_a_ready_endpoint_an_address_or_a_tcp_port() -> None:
    assert route_of(service(), []) is None
    assert route_of(service(), [endpoint_slice(False)]) is None
    # An endpoint slice whose port is another of the Service's (or none).
    assert route_of(service(), [endpoint_slice(True, port="other")]) is None
    assert route_of(service(cluster_ip="None"), [endpoint_slice(True)]) is None
    assert route_of(service(protocol="UDP"), [endpoint_slice(True)]) is None


def test_the_rules_translate_from_pods_and_the_node_and_masquerade_what_they_translated() -> None:
    route = ServiceRoute("10.0.0.80", 8000, "10.232.2.7", 8001)
    pre, out, post = nat_commands(route)
    dnat = ["-d", "10.0.0.80", "-p", "tcp", "--dport", "8000", "-j", "DNAT"]
    for rule, chain in ((pre, "PREROUTING"), (out, "OUTPUT")):
        assert rule[:5] == ["iptables", "-t", "nat", "-A", chain]
        assert rule[5:13] == dnat and rule[13:] == ["--to-destination", "10.232.2.7:8001"]
    assert post[4] == "POSTROUTING" and post[-2:] == ["-j", "MASQUERADE"]
    # Only connections translated to the endpoint: the endpoint's own node-local
    # traffic keeps its source address.
    assert post[5:11] == ["-d", "10.232.2.7", "-p", "tcp", "--dport", "8001"]
    assert post[13:15] == ["--ctstate", "DNAT"]
