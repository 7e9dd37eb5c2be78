#!/usr/bin/env bash
# Build (or reuse) promtool from source through the Go module proxy, cached by version
# outside the work tree, as hack/helm.sh does for helm. Progress goes to stderr; the last
# line printed on stdout is the path of the promtool binary.
set -euo pipefail

# Prometheus tags its Go module v0.<minor*100+patch>.0: v0.316.0 is Prometheus 3.16.0.
version=${PROMTOOL_VERSION:-v0.316.0}
cache_root=${COMPOSABLE_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composable-dra}
out="$cache_root/promtool/$version"
bin="$out/promtool"

log() { printf '[promtool] %s\n' "$*" >&2; }

if [[ -x $bin ]]; then
  log "reusing cached promtool $version"
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed or not on PATH; Go >= 1.26 is needed to build promtool $version."
  log "Install Go, or put a promtool $version binary at $bin"
  exit 1
fi

mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building promtool $version from source (a cold build takes several minutes) ..."
start=$SECONDS
# `go install` of a module version builds it with exactly its own go.mod; GOBIN puts the
# binary in the temporary directory first, so a killed build never leaves a half-written
# promtool in the cache.
CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS="-mod=mod -trimpath" \
  go install -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" \
  "github.com/prometheus/prometheus/cmd/promtool@$version"
mv "$tmp/promtool" "$bin"
log "built promtool $version in $((SECONDS - start))s"
"$bin" --version >&2
echo "$bin"
