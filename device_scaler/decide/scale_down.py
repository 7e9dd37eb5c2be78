"""Phase 4: idle scale-down, least recently used first, honouring min/max.

Idle GPUs are detached after the no-removal window, never below a ComposabilityRequest's
minSize for that node and model; above its maxSize idle ones go first, window or not.
"""

from __future__ import annotations

from composable_dra.k8s.timestamps import format_time
from composable_dra.model.sizing import least_recently_used, limits
from device_scaler.decide.actions import Action, DeleteResource
from device_scaler.decide.idle import IdleGPU
from device_scaler.decide.reading import meta_of
from device_scaler.decide.view import Counts, DecisionView, count_key


def scale_down(
    view: DecisionView, counts: Counts, idle: list[IdleGPU], keep: frozenset[str] = frozenset()
) -> list[Action]:
    """``keep``: idle GPUs a warm standby holds (phase 4b), left alone."""
    actions: list[Action] = []
    by_name = {meta_of(i.cr)["name"]: i for i in idle if meta_of(i.cr)["name"] not in keep}
    for cr in least_recently_used((i.cr for i in by_name.values()), view.s.now):
        gpu = by_name[meta_of(cr)["name"]]
        fabric, node, model = count_key(gpu.spec)
        node_lim = limits(view.s.requests, fabric, model, node)
        cluster_lim = limits(view.s.requests, fabric, model, None)
        n_node, n_all = counts.count(fabric, node, model), counts.count(fabric, None, model)
        over = (node_lim.max_size is not None and n_node > node_lim.max_size) or (
            cluster_lim.max_size is not None and n_all > cluster_lim.max_size
        )
        expired = view.s.now - gpu.last_used >= view.cfg.no_removal
        if not (over or expired):
            continue
        if n_node - 1 < node_lim.min_size or n_all - 1 < cluster_lim.min_size:
            continue
        reason = "IdleTimeout" if expired else "OverMaxSize"
        message = f"idle since {format_time(gpu.last_used)}; detaching"
        actions.append(DeleteResource(meta_of(cr)["name"], reason, message))
        counts = counts.add((fabric, node, model), -1)
    return actions
