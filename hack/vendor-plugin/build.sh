#!/usr/bin/env bash
# Build (or reuse) the vendor-like kubelet plugin (main.go) through the Go module proxy.
# The binary is cached by the version of the helper library it is built on and a digest
# of its sources, outside the work tree; the last line printed is its directory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_name=vendor-plugin
# shellcheck source=hack/lib/build.sh
source "$here/../lib/build.sh"
dra_version=$(module_version "$here/go.mod" k8s.io/dynamic-resource-allocation)
[[ -n $dra_version ]] || { echo "cannot read the dynamic-resource-allocation version from $here/go.mod" >&2; exit 1; }
# A source change is a new binary: the digest covers the Go files and the module files.
digest=$(cat "$here"/*.go "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
out="$cache_root/vendor-plugin/dra-${dra_version}_${digest}"

start_build "$out" "binary (dynamic-resource-allocation $dra_version)" "the vendor plugin" \
  "whose vendor-plugin/dra-${dra_version}_${digest}/ already holds vendor-plugin" vendor-plugin
GOFLAGS+=" -mod=mod"
start=$SECONDS
log "building against dynamic-resource-allocation $dra_version ..."
(cd "$here" && go build -ldflags "-s -w" -o "$tmp/vendor-plugin" .)
mv "$tmp/vendor-plugin" "$out/vendor-plugin"
log "built in $((SECONDS - start))s"
echo "$out"
