#!/usr/bin/env bash
# Build (or reuse) the vendor-like kubelet plugin (main.go) through the Go module proxy.
# The binary is cached by the version of the helper library it is built on and a digest
# of its sources, outside the work tree; the last line printed is its directory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dra_version=$(grep -oE "^\s*(require )?k8s.io/dynamic-resource-allocation v[^ ]+" "$here/go.mod" | awk '{print $NF}')
[[ -n $dra_version ]] || { echo "cannot read the dynamic-resource-allocation version from $here/go.mod" >&2; exit 1; }
# A source change is a new binary: the digest covers the Go files and the module files.
digest=$(cat "$here"/*.go "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache_root=${COMPOSABLE_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composable-dra}
out="$cache_root/vendor-plugin/dra-${dra_version}_${digest}"

log() { printf '[vendor-plugin] %s\n' "$*" >&2; }

if [[ -x "$out/vendor-plugin" ]]; then
  log "reusing cached binary (dynamic-resource-allocation $dra_version)"
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed or not on PATH; Go >= 1.26 is needed to build the vendor plugin."
  log "Install it from your distribution or https://go.dev/dl, or set COMPOSABLE_DRA_CACHE to a"
  log "directory whose vendor-plugin/dra-${dra_version}_${digest}/ already holds vendor-plugin"
  exit 1
fi

mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath -mod=mod"
start=$SECONDS
log "building against dynamic-resource-allocation $dra_version ..."
(cd "$here" && go build -ldflags "-s -w" -o "$tmp/vendor-plugin" .)
mv "$tmp/vendor-plugin" "$out/vendor-plugin"
log "built in $((SECONDS - start))s"
echo "$out"
