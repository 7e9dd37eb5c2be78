#!/usr/bin/env bash
# Regenerate the committed Python stubs of the kubelet protocols in api/.
# Usage: hack/gen-protos.sh [OUTPUT_ROOT]   (default: the repository root)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root}
python=${PYTHON:-$root/.venv/bin/python}
cd "$root"
protos=(api/dra/v1/api.proto api/dra/v1beta1/api.proto api/pluginregistration/v1/api.proto api/dra_health/v1/api.proto api/dra_health/v1alpha1/api.proto)
PATH="$(dirname "$python"):$PATH" "$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  "${protos[@]}"
