"""The scheduler-throughput bench's own arithmetic and its cluster's shape."""

from __future__ import annotations

from typing import Any

from composable_dra.model import names
from hack.bench.sched import (
    Republisher,
    fabric_view,
    free_local_gpus,
    inventory,
    label_zone_nodes,
    metric_sums,
    per_attempt,
    sched_goals,
    window_of,
)
from pool_publisher.publish import desired_pools, plan_pools
from pool_publisher.window import AUTO, MARGIN, MIN_WINDOW, WindowPolicy

EXT = "scheduler_framework_extension_point_duration_seconds"
PLUGIN = "scheduler_plugin_execution_duration_seconds"


def series(name: str, labels: str, value: float) -> str:
    return f'{name}{{{labels},profile="d"}} {value}'


METRICS = "\n".join(
    [
        f"# HELP {EXT} x",
        series(f"{EXT}_sum", 'extension_point="Filter",status="Success"', 3),
        series(f"{EXT}_count", 'extension_point="Filter",status="Success"', 2),
        series(f"{EXT}_sum", 'extension_point="Filter",status="Unschedulable"', 1),
        series(f"{EXT}_count", 'extension_point="Filter",status="Unschedulable"', 2),
        series(f"{EXT}_sum", 'extension_point="Score",status="Success"', 9),
        series(f"{PLUGIN}_sum", 'extension_point="Filter",plugin="NodeName"', 9),
        series(f"{PLUGIN}_sum", 'extension_point="Filter",plugin="DynamicResources"', 0.5),
        series(f"{PLUGIN}_count", 'extension_point="Filter",plugin="DynamicResources"', 10),
    ]
)


def test_metric_sums_keep_the_dra_plugins_filtering_summed_over_statuses() -> None:
    sums = metric_sums(METRICS)
    filter_ = 'scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter"}'
    assert sums[filter_] == 4.0
    assert not any("Score" in k or "NodeName" in k for k in sums)


def test_per_attempt_is_the_mean_over_the_burst() -> None:
    before = metric_sums(METRICS)
    after = {k: v * 3 for k, v in before.items()}  # twice as much again
    means = per_attempt(before, after)
    key = 'scheduler_framework_extension_point_duration_seconds{extension_point="Filter"}'
    assert means[key] == 1.0  # 8 s over 8 calls
    assert means[key + " calls"] == 8


def test_the_bench_publishes_the_pools_as_the_publisher_would() -> None:
    view = fabric_view(inventory(nodes=32, zones=4, pool_gpus=400), lambda h: f"{h}-s")
    every = desired_pools(view, set())
    assert len(every) == 4 and all(len(p.nodes) == 8 for p in every.values())
    assert sum(len(p.devices) for p in every.values()) == 400
    windowed = desired_pools(view, set(), max_free=32)
    assert all(len(p.devices) == 32 for p in windowed.values())
    # One slice a pool with the window; the whole zone takes one slice per 128.
    assert len(plan_pools(windowed, [], names.DRIVER).apply) == 4
    assert len(plan_pools(every, [], names.DRIVER).apply) == 4


def test_the_bench_pools_select_their_zone_by_the_label_it_puts_on_the_nodes() -> None:
    view = fabric_view(inventory(nodes=8, zones=2, pool_gpus=40), lambda h: f"{h}-s")
    labelled: dict[str, dict[str, str]] = {}

    class FakeKube:
        def merge_patch(self, url: str, body: dict[str, Any]) -> None:
            labelled[url.rsplit("/", 1)[-1]] = body["metadata"]["labels"]

    label_zone_nodes(FakeKube(), view)  # type: ignore[arg-type]
    assert len(labelled) == 8 and all(len(v) == 1 for v in labelled.values())
    for pool in desired_pools(view, set()).values():
        [sl] = plan_pools({pool.name: pool}, [], names.DRIVER).apply
        [term] = sl["spec"]["nodeSelector"]["nodeSelectorTerms"]
        [req] = term["matchExpressions"]
        carriers = {n for n, got in labelled.items() if got.get(req["key"]) == req["values"][0]}
        assert carriers == set(pool.nodes)
    hostnames = fabric_view(inventory(nodes=8, zones=2, pool_gpus=40), str, by_label=False)
    [pool, _] = desired_pools(hostnames, set()).values()
    assert pool.label is None


def test_the_republisher_writes_only_the_pool_an_allocation_changed() -> None:
    writes: list[str] = []

    class FakeKube:
        def apply(self, url: str, obj: dict[str, object], manager: str) -> None:
            writes.append(url.rsplit("/", 1)[-1])

        def delete(self, url: str) -> None:
            writes.append("delete " + url.rsplit("/", 1)[-1])

    view = fabric_view(inventory(nodes=8, zones=2, pool_gpus=40), lambda h: f"{h}-s")
    rep = Republisher(FakeKube(), view)  # type: ignore[arg-type]
    rep.window = WindowPolicy(4)
    rep.publish()
    assert sorted(writes) == ["fabric-1-zone-1-0", "fabric-1-zone-2-0"]
    writes.clear()
    rep.publish()
    assert writes == []  # nothing changed: nothing written
    pool = "fabric-1/zone-1"
    rep.allocated(
        [
            {
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [{"driver": names.DRIVER, "pool": pool, "device": "pool-1"}]
                        }
                    }
                }
            }
        ]
    )
    rep.publish()
    assert writes == ["fabric-1-zone-1-0"]


def test_the_republishers_window_follows_the_pending_claims() -> None:
    class FakeKube:
        def apply(self, url: str, obj: dict[str, object], manager: str) -> None:
            pass

    view = fabric_view(inventory(nodes=8, zones=2, pool_gpus=400), lambda h: f"{h}-s")
    rep = Republisher(FakeKube(), view)  # type: ignore[arg-type]
    rep.publish()
    assert rep.size == MIN_WINDOW  # the publisher's default, nothing pending
    rep.allocated([{"metadata": {"name": f"c{i}"}, "status": {}} for i in range(100)])
    rep.publish()
    assert rep.size == 50 + MARGIN  # 100 pending claims over 2 pools
    pools = {str(o["spec"]["pool"]["name"]) for o in rep.observed.values()}
    assert (
        all(len(o["spec"]["devices"]) == 50 + MARGIN for o in rep.observed.values())
        and len(pools) == 2
    )


def test_the_local_burst_frees_each_nodes_share_and_one_more() -> None:
    deleted: list[str] = []

    class FakeKube:
        def delete(self, url: str) -> None:
            deleted.append(url.rsplit("/", 1)[-1])

    freed = free_local_gpus(FakeKube(), "s", nodes=4, gpus_per_node=8, pods=10)  # type: ignore[arg-type]
    assert freed == len(deleted) == 4 * 4  # ceil(10 / 4) + 1 a node
    assert len(set(deleted)) == freed and all(d.startswith("node-") for d in deleted)
    assert free_local_gpus(FakeKube(), "s", nodes=1, gpus_per_node=2, pods=10) == 2  # type: ignore[arg-type]


def burst_out(
    cpu: float, rate: float | None, allocated: int = 10, served: str = "gpu/pool"
) -> dict[str, object]:
    return {
        "allocated": allocated,
        "scheduler_cpu_s_per_claim": cpu,
        "claims_per_s": rate,
        "served_by": {served: allocated},
    }


def test_the_goals_compare_the_default_pool_burst_with_the_local_one() -> None:
    out = {
        "bursts": {
            "pool-auto": burst_out(0.3, 2.0),
            "pool-all": burst_out(9, 0.1),
            "local": burst_out(0.2, 5.0, served="gpu/local"),
        }
    }
    goals = sched_goals(out, 10)
    assert goals["pool_vs_local_cpu_per_claim"]["value"] == 1.5
    assert goals["pool_vs_local_cpu_per_claim"]["met"]
    assert goals["pool_vs_local_claims_per_s"]["value"] == 0.4
    assert not goals["pool_vs_local_claims_per_s"]["met"]
    assert goals["unallocated"]["met"] and goals["local_burst_served_locally"]["met"]
    # A burst that left claims, or a rate not measured, misses.
    out["bursts"]["local"] = burst_out(0.2, None, allocated=9, served="gpu/local")
    goals = sched_goals(out, 10)
    assert not goals["unallocated"]["met"] and not goals["pool_vs_local_claims_per_s"]["met"]
    # A local claim that the pool served: prefer-local failed.
    assert not goals["local_burst_served_locally"]["met"]
    assert window_of("auto") == AUTO and window_of("32") == 32
