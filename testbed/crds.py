"""Install the suite's CRDs (deploy/crds) into a cluster and wait until they are served."""

from __future__ import annotations

from pathlib import Path

import yaml

from composable_dra.k8s.kube import Conflict, Kube, path
from testbed.wait import wait_for

CRD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "crds"
_CRDS = "apiextensions.k8s.io/v1"


def install_crds(kube: Kube, directory: Path = CRD_DIR) -> list[str]:
    names = []
    for manifest in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(manifest.read_text())
        name = crd["metadata"]["name"]
        try:
            kube.create(path(_CRDS, "customresourcedefinitions"), crd)
        except Conflict:
            kube.apply(path(_CRDS, "customresourcedefinitions", name), crd, "composable-dra-tests")
        names.append(name)

    def established() -> bool:
        for name in names:
            crd = kube.get(path(_CRDS, "customresourcedefinitions", name))
            conditions = {
                c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])
            }
            if conditions.get("Established") != "True":
                return False
        return True

    wait_for(established, 30, "the CRDs to be established")
    return names
