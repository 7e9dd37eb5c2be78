#!/usr/bin/env bash
# The end-to-end subset of each older Kubernetes release (testbed/versions.py: the tests
# marked @pytest.mark.versions for it), each its own pytest run on that release's control
# plane and real-node binaries (built once, cached by version), one after the other: their
# real nodes share the host's network names. Each run writes JUnit XML to
# $JUNIT_DIR/<release>.xml for hack/support_matrix.py and prints its time; all run, and the
# script fails if any failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
JUNIT_DIR=${JUNIT_DIR:-build/junit}
mkdir -p "$JUNIT_DIR"
failed=()
for release in $("$PY" -c 'from testbed.controlplane import RELEASES; print(*RELEASES.values())'); do
  bin_dir=$(KUBE_VERSION=$release bash hack/control-plane/build.sh | tail -n1)
  start=$SECONDS
  # NODE_BIN_DIR names the default release's node: the run finds its own by KUBE_VERSION.
  env -u NODE_BIN_DIR KUBE_VERSION="$release" KUBE_BIN_DIR="$bin_dir" \
    "$PY" -m pytest tests/e2e -q --junitxml="$JUNIT_DIR/$release.xml" || failed+=("$release")
  echo "== Kubernetes $release subset: $((SECONDS - start)) s"
done
if (( ${#failed[@]} )); then echo "failed on: ${failed[*]}" >&2; exit 1; fi
