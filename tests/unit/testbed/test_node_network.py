"""testbed.node_network: a real node's addresses, its CNI network and its API route."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from testbed.node_network import (
    API_SERVICE_IP,
    MAX_SLOTS,
    NodeAddresses,
    cni_conflist,
    host_link_commands,
    host_route_commands,
    inside_commands,
)


def test_each_slot_has_its_own_link_and_pod_network() -> None:
    nets = []
    for slot in (0, 1, 7, MAX_SLOTS - 1):
        a = NodeAddresses(slot)
        link = ipaddress.ip_network(f"{a.node_ip}/30", strict=False)
        assert ipaddress.ip_address(a.host_ip) in link
        assert a.host_ip != a.node_ip
        nets += [link, ipaddress.ip_network(a.pod_cidr)]
        # Linux limits interface names to 15 bytes.
        assert len(a.host_link) <= 15
    assert not [(x, y) for i, x in enumerate(nets) for y in nets[i + 1 :] if x.overlaps(y)]
    # None overlaps the Service network the API server's address comes from.
    service = ipaddress.ip_network("10.0.0.0/24")
    assert not [n for n in nets if n.overlaps(service)]


@pytest.mark.parametrize("slot", [-1, MAX_SLOTS])
def test_a_slot_out_of_range_is_refused(slot: int) -> None:
    with pytest.raises(ValueError, match="slot"):
        NodeAddresses(slot)


def test_the_cni_network_gives_addresses_from_the_node_pod_cidr(tmp_path: Path) -> None:
    a = NodeAddresses(3)
    conf = json.loads(cni_conflist(a, tmp_path / "ipam"))
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["isGateway"] and bridge["ipMasq"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": a.pod_cidr}]]
    # Address leases stay with the node, not in the host's /var/lib/cni.
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}


def test_the_api_service_address_leads_to_the_host_end_of_the_link() -> None:
    a = NodeAddresses(2)
    cmds = inside_commands(a, "cdra2n", 6443)
    assert ["ip", "link", "set", "cdra2n", "name", "eth0"] in cmds
    assert ["ip", "addr", "add", f"{a.node_ip}/30", "dev", "eth0"] in cmds
    assert ["ip", "route", "add", "default", "via", a.host_ip] in cmds
    dnat = [c for c in cmds if "DNAT" in c]
    # The node's own processes (the kubelet) and its pods both.
    assert sorted(c[c.index("-A") + 1] for c in dnat) == ["OUTPUT", "PREROUTING"]
    for c in dnat:
        assert c[c.index("-d") + 1] == API_SERVICE_IP
        assert c[c.index("--dport") + 1] == "443"
        assert c[-1] == f"{a.host_ip}:6443"


def test_the_host_routes_the_node_pod_network_and_forwards_on_its_link_only() -> None:
    a = NodeAddresses(4)
    link = host_link_commands(a)
    assert ["ip", "link", "set", a.host_link, "up"] in link
    route, forwarding = host_route_commands(a)
    assert route == ["ip", "route", "add", a.pod_cidr, "via", a.node_ip, "dev", a.host_link]
    # The link's own forwarding, not the host-wide net.ipv4.ip_forward.
    assert forwarding[-1] == f"net.ipv4.conf.{a.host_link}.forwarding=1"
