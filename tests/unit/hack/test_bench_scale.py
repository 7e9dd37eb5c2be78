"""The scale benchmark's pure parts: the fabric's shape, who made a request, the audit log."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import yaml

from composable_dra.k8s.wake import TOUCH_EVENT
from fabric_emulator.topology import parse
from hack.bench import scale

ROOT = Path(__file__).resolve().parents[3]


def test_topology_spreads_hosts_and_blocks_over_zones() -> None:
    topo = parse(scale.fabric_topology(nodes=10, zones=3, pool_gpus=7))
    assert len(topo.hosts) == 10
    assert [len(z.hosts) for z in topo.zones.values()] == [4, 3, 3]
    assert [len(z.blocks) for z in topo.zones.values()] == [3, 2, 2]
    # Every host is reachable from exactly one zone.
    assert sorted(h for z in topo.zones.values() for h in z.hosts) == sorted(topo.hosts)


def test_local_devices_are_stable_and_distinct() -> None:
    a = scale.local_devices("n1", 8)
    assert a == scale.local_devices("n1", 8)
    assert len({d.uuid for d in a + scale.local_devices("n2", 8)}) == 16


def test_component_of_user_agent() -> None:
    assert scale.component_of("kopf/1.37.2") == "operator"
    assert scale.component_of("composable-dra/scaler") == "scaler"
    assert scale.component_of("composable-dra/pool-publisher x") == "pool-publisher"
    assert scale.component_of("kube-scheduler/v1.37.1 (linux/amd64)") is None
    assert scale.component_of("bench/scale") is None


def _event(
    verb: str,
    uri: str,
    ua: str,
    stage: str = "ResponseComplete",
    at: str = "15:00:01.500000",
    code: int = 200,
    **ref: str,
) -> str:
    return json.dumps(
        {
            "stage": stage,
            "verb": verb,
            "requestURI": uri,
            "userAgent": ua,
            "objectRef": ref,
            "requestReceivedTimestamp": f"2026-11-23T{at}Z",
            "responseStatus": {"code": code},
        }
    )


def test_parse_audit_counts_writes_and_full_lists() -> None:
    lines = [
        _event("list", "/api/v1/nodes?limit=500", "kopf/1", resource="nodes"),
        _event(
            "list", "/api/v1/nodes?fieldSelector=a%3Db", "composable-dra/scaler", resource="nodes"
        ),
        _event("list", "/api/v1/nodes", "composable-dra/scaler", stage="ResponseStarted"),
        _event("create", "/apis/x/y", "composable-dra/scaler", resource="composableresources"),
        _event(
            "patch",
            "/apis/x/y/z/status",
            "composable-dra/plugin",
            resource="composableresources",
            subresource="status",
        ),
        _event("create", "/api/v1/pods", "bench/scale", resource="pods"),
        "not json",
    ]
    reqs = list(scale.parse_audit(lines))
    assert [(r.component, r.verb, r.full_list) for r in reqs] == [
        ("operator", "list", True),
        ("scaler", "list", False),
        ("scaler", "create", False),
        ("plugin", "patch", False),
    ]
    start = reqs[0].at
    assert scale.lists_after(reqs, start) == {
        "operator": {"full nodes": 1},
        "scaler": {"selected nodes": 1},
    }
    assert scale.lists_after(reqs, start + 1) == {}
    writes = scale.writes_by_component(reqs, start, start + 1)
    assert writes == {
        "scaler": {"create composableresources": 1},
        "plugin": {"patch composableresources/status": 1},
    }


def test_process_figures_of_this_process() -> None:
    assert scale.cpu_seconds(os.getpid()) > 0
    assert 1 < scale.peak_rss_mb(os.getpid()) < 10_000


def test_a_relist_is_a_full_list_after_one_that_succeeded() -> None:
    def lst(ua: str, at: str, code: int = 200, uri: str = "/api/v1/nodes") -> str:
        return _event("list", uri, ua, at=at, code=code, resource="nodes")

    reqs = list(
        scale.parse_audit(
            [
                lst("composable-dra/scaler", "15:00:01", code=429),  # refused: not a list yet
                lst("composable-dra/scaler", "15:00:05"),  # its first list, after the start
                lst("kopf/1", "15:00:00"),  # the operator's first, before the start
                lst("kopf/1", "15:00:06"),
                lst("kopf/1", "15:00:07", uri="/api/v1/nodes?labelSelector=a%3Db"),
                # The second page of the scaler's first list: not a list of its own.
                lst("composable-dra/scaler", "15:00:07", uri="/api/v1/nodes?limit=500&continue=x"),
                lst("composable-dra/scaler", "15:00:08"),
            ]
        )
    )
    start = reqs[0].at
    assert scale.full_relists(reqs, start) == {"operator": {"nodes": 1}, "scaler": {"nodes": 1}}
    assert scale.full_relists(reqs, start + 6.5) == {"scaler": {"nodes": 1}}


def test_wake_touches_are_counted_from_the_publishers_log_within_the_burst() -> None:
    events = [
        {"event": TOUCH_EVENT, "timestamp": "2026-11-27T10:00:01.500000Z"},
        {"event": TOUCH_EVENT, "timestamp": "2026-11-27T10:00:09Z"},  # after the burst
        {"event": "pools published", "timestamp": "2026-11-27T10:00:02Z"},
        {"event": TOUCH_EVENT},  # no time: not counted
    ]
    start = 1_795_773_600.0  # 2026-11-27T10:00:00Z
    assert scale.wake_touches(events, start, start + 5) == 1


def test_shape_flags_are_one_set_with_each_bench_its_node_default() -> None:
    p = argparse.ArgumentParser()
    scale.add_shape_arguments(p, nodes=100)
    args = p.parse_args(["--zones", "4", "--workdir", "/tmp/w"])
    assert (args.nodes, args.zones, args.pool_gpus, args.gpus_per_node) == (100, 4, 4000, 8)
    assert (args.timeout, args.workdir) == (900, Path("/tmp/w"))
    full = scale.parse_args([])
    assert (full.nodes, full.zones, full.pool_gpus, full.timeout) == (1000, 16, 4000, 900)


def test_with_no_flags_the_fabric_polls_at_its_own_default() -> None:
    # The defaults of issue 28 include the Fabric's: the tests' 5 s read the whole
    # inventory six times as often as a user's Fabric does.
    crd = yaml.safe_load((ROOT / "deploy/crds/composable.dra.io_fabrics.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert scale.parse_args([]).fabric_poll == spec["properties"]["pollIntervalSeconds"]["default"]
    assert scale.parse_args(["--fabric-poll", "5"]).fabric_poll == 5


def test_a_run_without_workdir_leaves_no_files_and_one_with_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its files are ~250 MB at 1,000 nodes: gone with the run unless asked for."""
    used: list[Path] = []

    def fake_run(args: argparse.Namespace, workdir: Path) -> int:
        (workdir / "audit.log").write_text("x")
        used.append(workdir)
        return 0

    monkeypatch.setattr(scale, "run", fake_run)
    assert scale.main([]) == 0
    assert not used[0].exists()
    kept = tmp_path / "kept"
    assert scale.main([f"--workdir={kept}"]) == 0
    assert used[1] == kept and (kept / "audit.log").exists()
