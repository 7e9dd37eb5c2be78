"""Which Kubernetes release a test run is on, and which end-to-end tests run on it.

A run is on the default release (the one hack/control-plane/kubernetes/go.mod pins), or on
the one ``KUBE_VERSION`` names, which the build scripts then build and ``find_binaries``
finds. Every end-to-end test runs on the default release; a test marked
``@pytest.mark.versions("1.35", "1.36")`` also runs on those older releases, and a run on
an older release runs only the tests marked for it (``make test`` runs each one's subset:
hack/versions-test.sh); ``versions("1.35", default=False)``: on v1.35 only. Nothing is
skipped: a test not meant for the run is deselected.

A gated run (``KUBE_GATES=on``) is an older release with the alpha gates ``GATED`` names
for it turned on in every component (the API server, scheduler, controller manager,
kubelets): its label is ``<release>+gates`` (``v1.35.8+gates``), and it runs only the
tests marked ``versions(..., gated=("1.35",))``: those that show what the gates give.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MARKER = "versions"
GATED_SUFFIX = "+gates"
# Per older minor, the gates a gated run turns on: what the support matrix's cells for
# that release say to turn on (each release's pkg/features/kube_features.go: alpha, off).
GATED: dict[str, dict[str, bool]] = {
    "1.35": {"DRADeviceBindingConditions": True, "DRAPartitionableDevices": True}
}
_PINNED = Path(__file__).resolve().parents[1] / "hack/control-plane/kubernetes/go.mod"


def default_release() -> str:
    """The release the committed wrapper module pins (e.g. ``v1.37.1``)."""
    found = re.search(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)", _PINNED.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"{_PINNED} pins no k8s.io/kubernetes release")
    return found.group(1)


def minor(release: str) -> str:
    """``v1.35.8`` -> ``1.35``."""
    found = re.fullmatch(r"v?(1\.\d+)(\.\d+)?", release)
    if found is None:
        raise ValueError(f"not a Kubernetes release: {release!r}")
    return found.group(1)


def run_release() -> str:
    """This run's release: ``KUBE_VERSION``, else the default."""
    return os.environ.get("KUBE_VERSION") or default_release()


def gates_on() -> bool:
    """Whether this run turns its release's ``GATED`` gates on (``KUBE_GATES=on``)."""
    return os.environ.get("KUBE_GATES", "") == "on"


def run_label() -> str:
    """This run's name in the results: its release, ``+gates`` when gated."""
    return run_release() + (GATED_SUFFIX if gates_on() else "")


def run_gates() -> dict[str, bool]:
    """The feature gates this run turns on: none, or the gated release's ``GATED``.
    ValueError when a gated run's release has none to turn on."""
    if not gates_on():
        return {}
    found = GATED.get(minor(run_release()))
    if found is None:
        raise ValueError(f"KUBE_GATES=on: no gates to turn on for {run_release()} ({GATED})")
    return dict(found)


def runs_on(
    marked: tuple[str, ...] | None,
    on_default: bool,
    release: str,
    gated: tuple[str, ...] = (),
) -> bool:
    """Whether a test runs on ``release`` (a run's label: ``+gates`` for a gated run):
    ``marked``, the older minors its marker names (None: not marked); ``on_default``,
    whether it runs on the default release too (the marker's ``default=``, true unless
    it says otherwise); ``gated``, the minors whose gated runs it is in (``gated=``)."""
    if release.endswith(GATED_SUFFIX):
        return minor(release.removesuffix(GATED_SUFFIX)) in gated
    if minor(release) == minor(default_release()):
        return on_default
    return minor(release) in (marked or ())
