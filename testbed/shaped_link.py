"""One shaped link: a network namespace behind a veth pair whose two ends are rate-limited.

What a pod's network would be on a real node, with the link between it and the donors
narrowed on purpose: the process run in the namespace (``ip netns exec``, ``wrap``)
reaches the host's end of the pair, where the donors listen, through a token bucket
filter (``tc qdisc ... tbf``) in each direction at the same rate. Needs root (``ip``,
``tc``); ``ShapedLink.available()`` says why not where it is missing. ``measure`` takes
the link's rate with iperf3 (Debian's), the namespace sending to the host, as frames go.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.controlplane import free_port
from testbed.wait import wait_for

# A token bucket holds at least one MTU-sized burst; the queue's wait bounds its length.
BURST, LATENCY = "32kb", "200ms"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass
class ShapedLink:
    workdir: Path
    tag: str = field(default_factory=lambda: str(os.getpid() % 100_000))
    # 10.233.<subnet>.0/30: not the real nodes' transfer networks (10.231/16) or pod
    # networks (10.232/16, testbed/node_network.py), which may be up on the same host.
    subnet: int = field(default_factory=lambda: 1 + os.getpid() % 250)

    @property
    def namespace(self) -> str:
        return f"cdra-link-{self.tag}"

    @property
    def host_address(self) -> str:
        """Where the donors listen: the host's end of the link."""
        return f"10.233.{self.subnet}.1"

    @property
    def _ends(self) -> tuple[str, str]:
        return f"cdl{self.tag}h", f"cdl{self.tag}n"  # host end, namespace end

    @staticmethod
    def available() -> str | None:
        """None when links can be made here; else why not."""
        if os.geteuid() != 0:
            return "a shaped link needs root (ip netns, tc)"
        missing = [t for t in ("ip", "tc", "iperf3") if shutil.which(t) is None]
        return f"missing: {', '.join(missing)}" if missing else None

    def start(self) -> ShapedLink:
        host, inner = self._ends
        _run("ip", "netns", "add", self.namespace)
        _run("ip", "-n", self.namespace, "link", "set", "lo", "up")
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", self.namespace)
        _run("ip", "addr", "add", f"{self.host_address}/30", "dev", host)
        _run("ip", "link", "set", host, "up")
        inner_address = f"10.233.{self.subnet}.2/30"
        _run("ip", "-n", self.namespace, "addr", "add", inner_address, "dev", inner)
        _run("ip", "-n", self.namespace, "link", "set", inner, "up")
        return self

    def shape(self, rate: str) -> None:
        """Both directions at ``rate`` (tc's notation: ``20mbit``)."""
        host, inner = self._ends
        tbf = ["root", "tbf", "rate", rate, "burst", BURST, "latency", LATENCY]
        _run("tc", "qdisc", "replace", "dev", host, *tbf)
        _run("ip", "netns", "exec", self.namespace, "tc", "qdisc", "replace", "dev", inner, *tbf)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def measure(self, seconds: float = 4.0) -> float:
        """Bytes/s the link carries from the namespace to the host (iperf3, TCP)."""
        port = free_port()
        log = self.workdir / f"iperf3-server-{port}.log"
        server = subprocess.Popen(
            [
                *("iperf3", "-s", "-1", "-B", self.host_address, "-p", str(port)),
                *("--forceflush", "--logfile", str(log)),
            ],
        )
        try:
            wait_for(
                lambda: log.exists() and "Server listening" in log.read_text(),
                10,
                "iperf3's server to listen",
            )
            argv = ["iperf3", "-c", self.host_address, "-p", str(port), "-J"]
            done = subprocess.run(
                self.wrap([*argv, "-t", str(seconds)]),
                check=True,
                capture_output=True,
                timeout=seconds + 30,
            )
        finally:
            server.kill()
            server.wait(10)
        report = json.loads(done.stdout)
        return float(report["end"]["sum_received"]["bits_per_second"]) / 8

    def stop(self) -> None:
        host, _ = self._ends
        subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
