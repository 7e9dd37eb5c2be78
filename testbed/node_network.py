"""A real node's own network: a network namespace joined to the host by a veth pair, a
bridge CNI network that gives its pods addresses, and a route to the API server.

The node's namespace holder (``testbed.realnode``) unshares the network namespace; this
module plans the addresses and rules (pure functions) and applies them. The namespace,
its veth pair and every rule in it go away with the holder, so a crashed test leaves no
interface or rule behind on the host.

Pods reach the API server as in a cluster, at the ``kubernetes`` Service's address
(10.0.0.1:443, which the API server's certificate names): one DNAT rule in the node's
namespace sends it to the host's end of the veth pair, where the API server listens. That
rule is what kube-proxy would write for this one Service; kube-proxy itself would need
the Service's endpoints, which the local API server does not publish (it advertises the
loopback address, no valid endpoint). Other Services a test needs (the chart's fabric
emulator) are routed by ``testbed.service_routes``. The host routes each node's pod
network to the node, so pods of two nodes reach each other.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The kubernetes Service's address and port (testbed.controlplane: the first address of
# --service-cluster-ip-range, in the serving certificate).
API_SERVICE_IP = "10.0.0.1"
API_SERVICE_PORT = 443
# Transfer networks (a /30 per node) and pod networks (a /24 per node), by node slot.
_LINKS = ipaddress.IPv4Network("10.231.0.0/16")
_PODS = ipaddress.IPv4Network("10.232.0.0/16")
_HOST_LINK_PREFIX = "cdra"  # host-side veth names: cdra<slot>h (IFNAMSIZ is 15)
MAX_SLOTS = 256


class NodeNetworkError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeAddresses:
    """One node's addresses, from its slot (unique among the nodes running on this host)."""

    slot: int

    def __post_init__(self) -> None:
        if not 0 <= self.slot < MAX_SLOTS:
            raise ValueError(f"node network slot {self.slot} outside 0..{MAX_SLOTS - 1}")

    @property
    def link(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((int(_LINKS.network_address) + 256 * self.slot, 30))

    @property
    def host_ip(self) -> str:
        return str(self.link.network_address + 1)

    @property
    def node_ip(self) -> str:
        """The node's InternalIP: its end of the veth pair."""
        return str(self.link.network_address + 2)

    @property
    def pod_cidr(self) -> str:
        return str(ipaddress.IPv4Network((int(_PODS.network_address) + 256 * self.slot, 24)))

    @property
    def host_link(self) -> str:
        return f"{_HOST_LINK_PREFIX}{self.slot}h"


def cni_conflist(addrs: NodeAddresses, ipam_dir: Path) -> str:
    """The node's CNI network: a bridge (the pods' gateway, masquerading what leaves the
    pod network), host-local addresses from the node's pod CIDR (state in ``ipam_dir``,
    not the host-wide /var/lib/cni), portmap for hostPort, loopback in each pod."""
    body = {
        "cniVersion": "1.0.0",
        "name": "pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": addrs.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(body, indent=2) + "\n"


def inside_commands(addrs: NodeAddresses, peer: str, api_port: int) -> list[list[str]]:
    """What runs inside the node's network namespace once the veth ``peer`` is in it:
    loopback and eth0 up with the node's address, the default route to the host, and the
    API server's Service address sent to the host's end, from the node's own processes
    (OUTPUT) and from its pods (PREROUTING)."""
    link = addrs.link.prefixlen
    to = f"{addrs.host_ip}:{api_port}"
    dnat = ["-d", API_SERVICE_IP, "-p", "tcp", "--dport", str(API_SERVICE_PORT)]
    return [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "set", peer, "name", "eth0"],
        ["ip", "addr", "add", f"{addrs.node_ip}/{link}", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", addrs.host_ip],
        ["iptables", "-t", "nat", "-A", "OUTPUT", *dnat, "-j", "DNAT", "--to-destination", to],
        ["iptables", "-t", "nat", "-A", "PREROUTING", *dnat, "-j", "DNAT", "--to-destination", to],
    ]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def attach(holder_pid: int, api_port: int) -> NodeAddresses:
    """Join the network namespace of ``holder_pid`` to the host: the first free slot's
    veth pair and addresses, then :func:`inside_commands` run in the namespace."""
    for slot in range(MAX_SLOTS):
        addrs = NodeAddresses(slot)
        if _link_exists(addrs.host_link):
            continue
        peer = f"{_HOST_LINK_PREFIX}{slot}n"
        veth = ["type", "veth", "peer", "name", peer, "netns", str(holder_pid)]
        made = _run(["ip", "link", "add", addrs.host_link, *veth])
        if made.returncode != 0:
            if "exists" in made.stderr:
                continue  # another node took this slot meanwhile
            raise NodeNetworkError(f"veth for slot {slot}: {made.stderr.strip()}")
        _configure(addrs, holder_pid, peer, api_port)
        return addrs
    raise NodeNetworkError(f"no free node network slot (all {MAX_SLOTS} host links in use)")


def host_link_commands(addrs: NodeAddresses) -> list[list[str]]:
    """The host's end of the node's link, up with its address."""
    link = addrs.host_link
    return [
        ["ip", "addr", "add", f"{addrs.host_ip}/{addrs.link.prefixlen}", "dev", link],
        ["ip", "link", "set", link, "up"],
    ]


def host_route_commands(addrs: NodeAddresses) -> list[list[str]]:
    """Once the node's end is up: a route to the node's pod network through the node, and
    forwarding on this link only (not the host-wide ``ip_forward``), so that pods of two
    nodes reach each other through the host, as a cluster's pod network lets them. Both
    go with the link."""
    link = addrs.host_link
    return [
        ["ip", "route", "add", addrs.pod_cidr, "via", addrs.node_ip, "dev", link],
        ["sysctl", "-q", "-w", f"net.ipv4.conf.{link}.forwarding=1"],
    ]


def _configure(addrs: NodeAddresses, holder_pid: int, peer: str, api_port: int) -> None:
    enter = ["nsenter", f"--net=/proc/{holder_pid}/ns/net", "--"]
    inside = [[*enter, *c] for c in inside_commands(addrs, peer, api_port)]
    for argv in [*host_link_commands(addrs), *inside, *host_route_commands(addrs)]:
        out = _run(argv)
        if out.returncode != 0:
            raise NodeNetworkError(f"{' '.join(argv)}: {out.stderr.strip()}")
