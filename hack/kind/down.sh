#!/usr/bin/env bash
# Delete the kind cluster that hack/kind/up.sh made.
set -euo pipefail
kind delete cluster --name "${KIND_CLUSTER:-composable-dra}"
