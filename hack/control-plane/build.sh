#!/usr/bin/env bash
# Build (or reuse) etcd and the Kubernetes control plane from source through the Go
# module proxy: Kubernetes $KUBE_VERSION (e.g. v1.35.8), or by default the version
# kubernetes/go.mod pins. The binaries are cached by version outside the work tree; the
# last line printed is the directory that holds them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_name=control-plane
# shellcheck source=hack/lib/build.sh
source "$here/../lib/build.sh"
# shellcheck source=hack/lib/k8s-wrapper.sh
source "$here/../lib/k8s-wrapper.sh"
k8s_version=$(kube_version "$here/kubernetes/go.mod")
etcd_version=$(module_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $k8s_version && -n $etcd_version ]] || { echo "cannot read versions from $here/*/go.mod" >&2; exit 1; }
out="$cache_root/control-plane/kubernetes-${k8s_version}_etcd-${etcd_version}"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler)

start_build "$out" "binaries (kubernetes $k8s_version, etcd $etcd_version)" "the control plane" \
  "that already holds: ${binaries[*]}" "${binaries[@]}"
stamp=$(k8s_ldflags "$k8s_version")
k8s_module=$(kube_module_dir "$here/kubernetes" "$k8s_version")

start=$SECONDS
for b in "${missing[@]}"; do
  t0=$SECONDS
  if [[ $b == etcd ]]; then
    log "building etcd $etcd_version ..."
    (cd "$here/etcd" && go build -ldflags "-s -w" -o "$tmp/etcd" .)
  else
    log "building $b $k8s_version (a cold build takes several minutes) ..."
    (cd "$k8s_module" && go build -ldflags "-s -w $stamp" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b")
  fi
  mv "$tmp/$b" "$out/$b"
  log "built $b in $((SECONDS - t0))s"
done
log "control plane ready in $((SECONDS - start))s"
"$out/kube-apiserver" --version >&2
echo "$out"
