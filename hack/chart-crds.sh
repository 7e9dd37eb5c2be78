#!/usr/bin/env bash
# Copy the generated CRDs (deploy/crds, from `python -m api.crdgen`) into the Helm chart's
# crds/ directory. deploy/crds stays the one source; tests/unit/test_chart_crds.py fails
# when the chart's copy is stale.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/deploy/helm/composable-dra/crds"
mkdir -p "$dest"
rm -f "$dest"/*.yaml
cp "$root"/deploy/crds/*.yaml "$dest"/
echo "copied $(find "$dest" -name '*.yaml' | wc -l) CRDs into $dest" >&2
