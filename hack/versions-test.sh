#!/usr/bin/env bash
# The end-to-end subset of each older Kubernetes release (testbed/versions.py: the tests
# marked @pytest.mark.versions for it), each its own pytest run on that release's control
# plane and real-node binaries (built once, cached by version), one after the other: their
# real nodes share the host's network names. Then each gated run: an older release with the
# alpha gates testbed/versions.py GATED names for it turned on in every component
# (KUBE_GATES=on), running the tests marked versions(..., gated=(minor,)), labelled
# <release>+gates. Each run writes JUnit XML to $JUNIT_DIR/<label>.xml for
# hack/support_matrix.py and prints its time; all run, and the script fails if any failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
JUNIT_DIR=${JUNIT_DIR:-build/junit}
mkdir -p "$JUNIT_DIR"
failed=()
# One run: its release, then "on" for a gated run or "" for the release's defaults.
run() {
  local release=$1 gates=$2 label=$1${2:++gates} bin_dir start
  bin_dir=$(KUBE_VERSION=$release bash hack/control-plane/build.sh | tail -n1)
  start=$SECONDS
  # NODE_BIN_DIR names the default release's node: the run finds its own by KUBE_VERSION.
  env -u NODE_BIN_DIR KUBE_VERSION="$release" KUBE_GATES="$gates" KUBE_BIN_DIR="$bin_dir" \
    "$PY" -m pytest tests/e2e -q --junitxml="$JUNIT_DIR/$label.xml" || failed+=("$label")
  echo "== Kubernetes $label subset: $((SECONDS - start)) s"
}
for release in $("$PY" -c 'from testbed.controlplane import RELEASES; print(*RELEASES.values())'); do
  run "$release" ""
done
for release in $("$PY" -c 'from testbed.controlplane import RELEASES as R; from testbed.versions import GATED; print(*(R[m] for m in GATED))'); do
  run "$release" on
done
if (( ${#failed[@]} )); then echo "failed on: ${failed[*]}" >&2; exit 1; fi
