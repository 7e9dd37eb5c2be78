"""testbed.realnode_pods: an example's pod made to run on a real test node."""

from __future__ import annotations

from testbed import examples
from testbed.realnode_pods import for_real_node


def test_example_pod_keeps_its_claims_and_command() -> None:
    (pod,) = [d for d in examples.load("shared-claim") if d["metadata"]["name"] == "shared-gpu-a"]
    out = for_real_node(pod, "n1", "img:1")
    spec = out["spec"]
    # The node has a pod network: the pod stays out of the host network.
    assert "hostNetwork" not in spec
    # No cluster DNS on the test nodes: the node's resolver, no Warning.
    assert spec["dnsPolicy"] == "Default"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    (container,) = spec["containers"]
    assert container["image"] == "img:1"
    # What the example asks for stays as written.
    assert container["command"] == pod["spec"]["containers"][0]["command"]
    assert container["resources"] == pod["spec"]["containers"][0]["resources"]
    assert spec["resourceClaims"] == pod["spec"]["resourceClaims"]
    # The original is untouched (the same example is applied elsewhere).
    assert pod["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert "hostNetwork" not in pod["spec"]


def test_existing_node_selector_is_kept() -> None:
    pod = {"spec": {"nodeSelector": {"zone": "a"}, "containers": [{"name": "c", "image": "x"}]}}
    out = for_real_node(pod, "n2", "img")
    assert out["spec"]["nodeSelector"] == {"zone": "a", "kubernetes.io/hostname": "n2"}
