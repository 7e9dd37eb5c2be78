#!/usr/bin/env bash
# Build (or reuse) the helm CLI from source through the Go module proxy, cached by
# version outside the work tree. Progress goes to stderr; the last line printed on stdout
# is the path of the helm binary.
set -euo pipefail

version=${HELM_VERSION:-v3.22.0}
cache_root=${COMPOSABLE_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composable-dra}
# The build revision is part of the cache key: bump it when the build flags change.
out="$cache_root/helm/$version-r2"
bin="$out/helm"

log() { printf '[helm] %s\n' "$*" >&2; }

if [[ -x $bin ]]; then
  log "reusing cached helm $version"
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed or not on PATH; Go >= 1.26 is needed to build helm $version."
  log "Install Go, or put a helm $version binary at $bin"
  exit 1
fi

mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building helm $version from source (a cold build takes a few minutes) ..."
start=$SECONDS
# Stamp the Kubernetes version helm's own go.mod builds against, as helm's Makefile does:
# it is the default for .Capabilities.KubeVersion and for the chart's kubeVersion check.
gomod=$(cd "$tmp" && go mod download -json "helm.sh/helm/v3@$version" |
  sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
k8s_minor=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod" | cut -d. -f2)
[[ -n $k8s_minor ]] || { log "cannot read k8s.io/client-go's version from $gomod"; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
# `go install` of a module version builds it with exactly its own go.mod, outside any
# work tree; GOBIN puts the binary in the temporary directory first, so a killed build
# never leaves a half-written helm in the cache.
CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS="-mod=mod -trimpath" \
  go install -ldflags "$ldflags" \
  "helm.sh/helm/v3/cmd/helm@$version"
mv "$tmp/helm" "$bin"
log "built helm $version in $((SECONDS - start))s"
"$bin" version --short >&2
echo "$bin"
