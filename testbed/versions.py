"""Which Kubernetes release a test run is on, and which end-to-end tests run on it.

A run is on the default release (the one hack/control-plane/kubernetes/go.mod pins), or on
the one ``KUBE_VERSION`` names, which the build scripts then build and ``find_binaries``
finds. Every end-to-end test runs on the default release; a test marked
``@pytest.mark.versions("1.35", "1.36")`` also runs on those older releases, and a run on
an older release runs only the tests marked for it (``make test`` runs each one's subset:
hack/versions-test.sh); ``versions("1.35", default=False)``: on v1.35 only. Nothing is
skipped: a test not meant for the run is deselected.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MARKER = "versions"
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


def runs_on(marked: tuple[str, ...] | None, on_default: bool, release: str) -> bool:
    """Whether a test runs on ``release``: ``marked``, the older minors its marker names
    (None: not marked); ``on_default``, whether it runs on the default release too (the
    marker's ``default=``, true unless it says otherwise)."""
    if minor(release) == minor(default_release()):
        return on_default
    return minor(release) in (marked or ())
