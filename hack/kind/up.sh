#!/usr/bin/env bash
# A kind cluster with the whole suite: CDI on, the image built and loaded, the fabric
# emulator and the chart installed with the redfish device source, and a demo pod that
# gets a GPU from the pool. Needs docker, kind and kubectl; helm is built by hack/helm.sh
# when it is not on PATH.
#   hack/kind/up.sh            # then: kubectl get pods,resourceclaims,composableresources
#   hack/kind/down.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=${KIND_CLUSTER:-composable-dra}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.37.1}
image=composable-dra:dev
namespace=composable-dra

log() { printf '[kind] %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { log "ERROR: $1 is not installed"; exit 1; }; }
need docker
need kind
need kubectl
helm=$(command -v helm || bash "$root/hack/helm.sh" | tail -n1)

if kind get clusters | grep -qx "$cluster"; then
  log "reusing kind cluster $cluster"
else
  log "creating kind cluster $cluster ($node_image)"
  kind create cluster --name "$cluster" --image "$node_image" --config "$here/cluster.yaml" --wait 120s
fi
kubectl config use-context "kind-$cluster" >/dev/null

log "building $image"
docker build -t "$image" "$root"
kind load docker-image "$image" --name "$cluster"

# The emulator's one host is the kind node, matched by its systemUUID.
node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
uuid=$(kubectl get node "$node" -o jsonpath='{.status.nodeInfo.systemUUID}')
topology=$(mktemp)
trap 'rm -f "$topology"' EXIT
cat >"$topology" <<YAML
hosts:
  - {id: $node, uuid: $uuid}
zones:
  - id: zone-1
    hosts: [$node]
    blocks:
      - {id: gpu-1, model: NVIDIA H100 80GB HBM3}
      - {id: gpu-2, model: NVIDIA H100 80GB HBM3}
YAML

log "installing the chart into $namespace"
"$helm" upgrade --install composable-dra "$root/deploy/helm/composable-dra" \
  --namespace "$namespace" --create-namespace \
  --values "$here/values.yaml" --set-file emulator.topology="$topology" \
  --wait --timeout 5m

log "running the demo pod (deploy/examples/pool-only.yaml)"
kubectl apply -f "$root/deploy/examples/pool-only.yaml"
kubectl wait --for=condition=Ready pod/gpu-from-pool --timeout=180s
kubectl logs gpu-from-pool
log "done; remove it all with hack/kind/down.sh"
