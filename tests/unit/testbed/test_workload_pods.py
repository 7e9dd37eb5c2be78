"""testbed.workload.scenario_pod: the one pod builder of Workload.create_pod, suite_pod and
pod_with_claim, on emulated nodes and on real ones."""

from __future__ import annotations

from testbed.kubelet_emulator import RUN_SECONDS_ANNOTATION
from testbed.realnode_pods import ENV_AND_WAIT
from testbed.workload import PAUSE_IMAGE, scenario_pod


def test_emulated_pod_is_pause_with_its_claim_on_its_node() -> None:
    pod = scenario_pod("p1", "c1", node="n1", run_seconds=None, real_image=None)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == PAUSE_IMAGE
    assert "command" not in container
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "c1"}]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    assert spec["terminationGracePeriodSeconds"] == 0
    assert "annotations" not in pod["metadata"]
    assert "restartPolicy" not in spec


def test_emulated_run_seconds_is_the_emulator_annotation() -> None:
    pod = scenario_pod("p1", "p1", node=None, run_seconds=1, real_image=None)
    assert pod["metadata"]["annotations"] == {RUN_SECONDS_ANNOTATION: "1"}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert "nodeSelector" not in pod["spec"]  # wherever the scheduler puts it


def test_real_pod_prints_its_environment_and_waits() -> None:
    pod = scenario_pod("p1", "p1", node="real-1", run_seconds=None, real_image="img:1")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "img:1"
    assert container["command"] == ["sh", "-c", ENV_AND_WAIT]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "real-1"}
    assert spec["dnsPolicy"] == "Default"
    assert "restartPolicy" not in spec


def test_real_pod_with_run_seconds_exits_then_and_is_not_restarted() -> None:
    # Workload.create_pod gave a real node's pod the annotation, which a real kubelet
    # ignores, and a container sleeping an hour: it never ended.
    pod = scenario_pod("p1", "p1", node="real-1", run_seconds=2, real_image="img:1")
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["sh", "-c", "env; exec sleep 2"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert (
        "nodeSelector"
        not in scenario_pod("p2", "p2", node=None, run_seconds=None, real_image="img:1")["spec"]
    )
