"""The ComposabilityRequest controller: keep N devices of a model attached to a node.

plan_request decides, from the request and what the fabric and the cluster show, which
ComposableResources to create and which to delete; the kopf daemon applies the plan on
every change and every few seconds. Shrinking removes the least recently used devices
first (composable_dra.model.sizing: the scaler's idle rule uses the same order) and never one
that serves a claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import kopf

from api.v1alpha1 import (
    API_VERSION,
    GROUP,
    VERSION,
    ComposabilityRequestSpec,
    ComposableResourceSpec,
)
from composable_dra.fabric.backend import Inventory
from composable_dra.fabric.errors import FabricError
from composable_dra.fabric.registry import FabricConfigError, Fabrics
from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.model import names
from composable_dra.model.sizing import desired_size, least_recently_used, spec_of
from composable_dra.process import logs
from composable_operator.cluster_cache import Nodes, node_per_host

log = logs.get(__name__)


@dataclass(frozen=True)
class RequestPlan:
    create: list[tuple[str, str]]  # (device id, node)
    delete: list[str]  # resource names


def plan_request(
    spec: ComposabilityRequestSpec,
    owned: list[JSON],
    inv: Inventory,
    host_nodes: dict[str, str],
    taken: set[str],
) -> RequestPlan:
    """What to create or delete to bring the owned resources to the desired size.

    host_nodes maps fabric hosts to our nodes; taken are device ids that some
    ComposableResource already names (ours or anyone's).
    """
    specs = {r["metadata"]["name"]: s for r in owned if (s := spec_of(r)) is not None}
    live = [
        r
        for r in owned
        if r["metadata"]["name"] in specs
        and not r["metadata"].get("deletionTimestamp")
        and (r.get("status") or {}).get("phase") != "Failed"
    ]
    want = desired_size(spec)
    if len(live) > want:
        idle = [r for r in live if specs[r["metadata"]["name"]].claim_ref is None]
        victims = least_recently_used(idle, default=0.0)[: len(live) - want]
        return RequestPlan([], [r["metadata"]["name"] for r in victims])
    create: list[tuple[str, str]] = []
    nodes = sorted(set(host_nodes.values())) if spec.target_node is None else [spec.target_node]
    if not nodes:
        return RequestPlan([], [])
    per_node = {
        n: sum(1 for r in live if specs[r["metadata"]["name"]].target_node == n) for n in nodes
    }
    free = sorted(
        d.id
        for d in inv.devices.values()
        if d.state == "free" and d.model == spec.model and d.id not in taken
    )
    zones = {z.id: z for z in inv.zones.values()}
    for _ in range(want - len(live)):
        # Spread cluster-wide requests: the node with the fewest devices first.
        for node in sorted(nodes, key=lambda n: (per_node[n], n)):
            hosts = {h for h, n in host_nodes.items() if n == node}
            device = next(
                (
                    d
                    for d in free
                    if zones.get(inv.devices[d].zone) and zones[inv.devices[d].zone].hosts & hosts
                ),
                None,
            )
            if device is not None:
                free.remove(device)
                create.append((device, node))
                per_node[node] += 1
                break
        else:
            break  # nothing left that any node can reach
    return RequestPlan(create, [])


class RequestReconciler:
    def __init__(self, kube: Kube, fabrics: Fabrics, nodes: Nodes | None = None) -> None:
        # nodes: the operator's Node cache (none: each pass lists Nodes).
        self.kube, self.fabrics, self.nodes = kube, fabrics, nodes

    def reconcile(self, name: str, spec: ComposabilityRequestSpec) -> tuple[RequestPlan, JSON]:
        fabric, backend = self.fabrics.get(spec.fabric)
        inv = backend.inventory()
        host_nodes = node_per_host(self.nodes, self.kube, fabric, inv.hosts)
        resources = self.kube.get(
            path(API_VERSION, "composableresources"), fieldSelector=f"spec.fabric={spec.fabric}"
        )["items"]
        owned = [
            r for r in resources if r["metadata"].get("labels", {}).get(names.LABEL_REQUEST) == name
        ]
        taken = {s.device_id for r in resources if (s := spec_of(r)) is not None}
        plan = plan_request(spec, owned, inv, host_nodes, taken)
        for device, node in plan.create:
            body = {
                "apiVersion": API_VERSION,
                "kind": "ComposableResource",
                "metadata": {
                    "name": f"{name}-{device}".lower()[:253],
                    "labels": {names.LABEL_REQUEST: name, names.LABEL_FABRIC: spec.fabric},
                },
                "spec": ComposableResourceSpec(
                    fabric=spec.fabric, device_id=device, target_node=node, model=spec.model
                ).model_dump(by_alias=True, exclude_defaults=True),
            }
            with contextlib.suppress(Conflict):  # created on an earlier pass
                self.kube.create(path(API_VERSION, "composableresources"), body)
        for victim in plan.delete:
            self.kube.delete(path(API_VERSION, "composableresources", victim))
        current = [r for r in owned if r["metadata"]["name"] not in plan.delete]
        status = {
            "resources": sorted(
                [r["metadata"]["name"] for r in current]
                + [f"{name}-{d}".lower() for d, _ in plan.create]
            ),
            "online": sum(1 for r in current if (r.get("status") or {}).get("phase") == "Online"),
        }
        self.kube.merge_patch(
            path(API_VERSION, "composabilityrequests", name, subresource="status"),
            {"status": status},
        )
        return plan, status


def register(
    registry: kopf.OperatorRegistry, reconciler: RequestReconciler, interval: float = 3.0
) -> None:
    @kopf.daemon(
        GROUP, VERSION, "composabilityrequests", registry=registry, cancellation_timeout=10
    )
    async def keep_size(name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        rlog = log.bind(request=name)
        while not stopped:
            try:
                spec = ComposabilityRequestSpec.model_validate(dict(body.spec))
                plan, _ = await asyncio.to_thread(reconciler.reconcile, name, spec)
                if plan.create or plan.delete:
                    kopf.info(
                        body,
                        reason="Resizing",
                        message=f"creating {len(plan.create)}, removing {len(plan.delete)} "
                        f"ComposableResources toward size {desired_size(spec)}",
                    )
                    rlog.info("resizing", create=plan.create, delete=plan.delete)
            except (FabricError, FabricConfigError) as exc:
                rlog.warning("cannot reach the fabric", error=str(exc))
            except Exception:
                rlog.exception("request pass failed")
            await stopped.wait(interval)
