"""Pods made to run on a real node of this test machine (testbed.realnode).

A real node here has a pod network of its own (testbed.node_network) and no registry: a
pod runs from the local test image, pinned to its node, in the pod network (it is not
moved to the host network), with the node's resolver (there is no cluster DNS).
Everything else (claims, commands, environment) stays as written.
"""

from __future__ import annotations

import copy

from composable_dra.k8s.kube import JSON

# A real container's command: print the environment (the CDI edits), then wait.
ENV_AND_WAIT = "env; exec sleep 3600"


def for_real_node(pod: JSON, node: str | None, image: str) -> JSON:
    """A copy of ``pod`` that runs on the real node ``node`` (on whichever node the scheduler
    picks when None: every node is a real one) with ``image``."""
    out = copy.deepcopy(pod)
    spec = out["spec"]
    if node is not None:
        spec["nodeSelector"] = {
            **(spec.get("nodeSelector") or {}),
            "kubernetes.io/hostname": node,
        }
    # No cluster DNS here: the node's resolver, and no MissingClusterDNS Warning.
    spec.setdefault("dnsPolicy", "Default")
    # The test image's shell does not exit on SIGTERM while it waits on a child.
    spec["terminationGracePeriodSeconds"] = 1
    for container in spec.get("containers", []):
        container["image"] = image
    return out
