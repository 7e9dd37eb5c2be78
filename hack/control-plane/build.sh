#!/usr/bin/env bash
# Build (or reuse) etcd and the Kubernetes control plane from source through the Go
# module proxy. The binaries are cached by version outside the work tree; the last
# line printed is the directory that holds them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The versions come from the wrapper modules, so a version bump is a go.mod edit.
module_version() { grep -oE "^\s*(require )?$2 v[^ ]+" "$1" | awk '{print $NF}'; }
k8s_version=$(module_version "$here/kubernetes/go.mod" k8s.io/kubernetes)
etcd_version=$(module_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $k8s_version && -n $etcd_version ]] || { echo "cannot read versions from $here/*/go.mod" >&2; exit 1; }
cache_root=${COMPOSABLE_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composable-dra}
out="$cache_root/control-plane/kubernetes-${k8s_version}_etcd-${etcd_version}"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[control-plane] %s\n' "$*" >&2; }

missing=()
for b in "${binaries[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if ((${#missing[@]} == 0)); then
  log "reusing cached binaries (kubernetes $k8s_version, etcd $etcd_version)"
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  log "ERROR: Go is not installed or not on PATH; Go >= 1.26 is needed to build the control plane."
  log "Install it from your distribution or https://go.dev/dl, or set COMPOSABLE_DRA_CACHE to a"
  log "directory that already holds: ${binaries[*]}"
  exit 1
fi

mkdir -p "$out"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath"

minor=${k8s_version#v1.}; minor=${minor%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

start=$SECONDS
for b in "${missing[@]}"; do
  t0=$SECONDS
  if [[ $b == etcd ]]; then
    log "building etcd $etcd_version ..."
    (cd "$here/etcd" && go build -ldflags "-s -w" -o "$tmp/etcd" .)
  else
    log "building $b $k8s_version (a cold build takes several minutes) ..."
    (cd "$here/kubernetes" && go build -ldflags "-s -w $stamp" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b")
  fi
  mv "$tmp/$b" "$out/$b"
  log "built $b in $((SECONDS - t0))s"
done
log "control plane ready in $((SECONDS - start))s"
"$out/kube-apiserver" --version >&2
echo "$out"
