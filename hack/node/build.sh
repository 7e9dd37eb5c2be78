#!/usr/bin/env bash
# Build (or reuse) what a real node needs: the upstream kubelet, containerd v2 with its
# runc shim and ctr, and upstream's reference CNI plugins (loopback, bridge, host-local,
# portmap), all from source through the Go module
# proxy; install Debian's runc where it is missing. The binaries are cached by version
# outside the work tree; the last line printed is the directory that holds them. The
# kubelet is $KUBE_VERSION's (e.g. v1.35.8), by default the version kubelet/go.mod pins.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_name=node
# shellcheck source=hack/lib/build.sh
source "$here/../lib/build.sh"
# shellcheck source=hack/lib/k8s-wrapper.sh
source "$here/../lib/k8s-wrapper.sh"
k8s_version=$(kube_version "$here/kubelet/go.mod")
containerd_version=$(module_version "$here/containerd/go.mod" github.com/containerd/containerd/v2)
cni_version=$(module_version "$here/cni/go.mod" github.com/containernetworking/plugins)
[[ -n $k8s_version && -n $containerd_version && -n $cni_version ]] || {
  echo "cannot read versions from $here/*/go.mod" >&2
  exit 1
}
out="$cache_root/node/kubelet-${k8s_version}_containerd-${containerd_version}_cni-${cni_version}"
binaries=(kubelet containerd containerd-shim-runc-v2 ctr loopback bridge host-local portmap)

# runc is a C/Go program with its own release cycle; Debian's package is the simplest
# source, and containerd finds it on PATH.
apt_install_missing runc

start_build "$out" "binaries (kubelet $k8s_version, containerd $containerd_version, cni $cni_version)" \
  "the node binaries" "whose node/ subdirectory already holds: ${binaries[*]}" "${binaries[@]}"
k8s_stamp=$(k8s_ldflags "$k8s_version")
k8s_module=$(kube_module_dir "$here/kubelet" "$k8s_version")
containerd_stamp="-X github.com/containerd/containerd/v2/version.Version=$containerd_version"
# The graph drivers need C libraries or kernel features this project never uses.
containerd_tags="no_btrfs no_devmapper no_zfs no_aufs"

start=$SECONDS
for b in "${missing[@]}"; do
  t0=$SECONDS
  log "building $b (a cold build takes minutes) ..."
  case $b in
    kubelet)
      (cd "$k8s_module" && nice -n 10 go build -ldflags "-s -w $k8s_stamp" -o "$tmp/$b" k8s.io/kubernetes/cmd/kubelet)
      ;;
    containerd | containerd-shim-runc-v2 | ctr)
      (cd "$here/containerd" && nice -n 10 go build -tags "$containerd_tags" -ldflags "-s -w $containerd_stamp" \
        -o "$tmp/$b" "github.com/containerd/containerd/v2/cmd/$b")
      ;;
    loopback | bridge | host-local | portmap)
      # The same `tool` directives name each plugin's package in hack/node/cni/go.mod.
      pkg=$(grep -oE "github.com/containernetworking/plugins/plugins/[a-z]+/$b\$" "$here/cni/go.mod")
      (cd "$here/cni" && nice -n 10 go build -ldflags "-s -w" -o "$tmp/$b" "$pkg")
      ;;
  esac
  mv "$tmp/$b" "$out/$b"
  log "built $b in $((SECONDS - t0))s"
done
log "node binaries ready in $((SECONDS - start))s"
"$out/kubelet" --version >&2
"$out/containerd" --version >&2
echo "$out"
