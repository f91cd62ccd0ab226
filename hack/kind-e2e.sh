#!/usr/bin/env bash
# The local-cluster equivalent on kind, for machines WITH Docker. Best effort: it is NOT exercised
# on the development machines of this project (no Docker there); hack/cluster.sh is what CI runs.
#
#   hack/kind-e2e.sh up     create kind cluster "tputorch", install KubeRay (helm), fake TPU nodes
#   hack/kind-e2e.sh down   delete the kind cluster
#   hack/kind-e2e.sh env    print exports for the tests (TPUTORCH_USE_EXISTING_CLUSTER=1 ...)
#
# Differences from hack/cluster.sh:
#  * real kubelets for the control-plane node; TPU nodes are still KWOK nodes (from hack/nodes.yaml),
#    KWOK runs out of cluster against the kind API server, using hack/kwok-pod-stages.yaml;
#  * KubeRay runs in cluster (helm chart kuberay/kuberay-operator), so its dashboard calls go to
#    the head Service inside the cluster: there is no Ray head behind it (fake pods) and no fake
#    dashboard wired in. RayJobs reach Running but not a terminal state unless a real Ray image
#    runs; the fake-dashboard tests skip (TPUTORCH_DASHBOARD_URL unset). To wire the fake in, run
#    the operator out of cluster instead (see hack/cluster.sh) with KUBECONFIG from `kind`.
set -euo pipefail
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${KIND_CLUSTER_NAME:-tputorch}
KUBERAY_VERSION=${KUBERAY_VERSION:-1.6.0}  # authOptions (Ray token auth) needs 1.6
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}
DIR=${TPUTORCH_CLUSTER_DIR:-$(dirname "$HACK")/.cluster-kind}
BIN=$("$HACK/build.sh" dir)

up() {
  command -v docker >/dev/null || { echo "kind needs Docker" >&2; exit 1; }
  command -v kind >/dev/null || GOBIN="$BIN" go install sigs.k8s.io/kind@v0.30.0
  export PATH="$BIN:$PATH"
  "$HACK/build.sh" cluster >/dev/null   # kwok
  [[ -x $BIN/helm ]] || "$HACK/build.sh" helm >/dev/null
  mkdir -p "$DIR/logs"
  kind get clusters | grep -qx "$NAME" || kind create cluster --name "$NAME" --image "$KIND_NODE_IMAGE" \
    --kubeconfig "$DIR/kubeconfig" --wait 120s
  export KUBECONFIG=$DIR/kubeconfig
  helm repo add kuberay https://ray-project.github.io/kuberay-helm/ >/dev/null 2>&1 || true
  helm upgrade --install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
    --namespace kuberay-system --create-namespace --wait \
    --set featureGates[0].name=RayMultiHostIndexing --set featureGates[0].enabled=true
  kubectl create -f "$HACK/nodes.yaml" 2>&1 | grep -v AlreadyExists || true
  if [[ ! -f $DIR/kwok.pid ]] || ! kill -0 "$(cat "$DIR/kwok.pid")" 2>/dev/null; then
    nohup "$BIN/kwok" --kubeconfig="$KUBECONFIG" --config="$HACK/kwok-pod-stages.yaml" \
      --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
      >"$DIR/logs/kwok.log" 2>&1 &
    echo $! >"$DIR/kwok.pid"
  fi
  kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s
}

down() {
  [[ -f $DIR/kwok.pid ]] && kill "$(cat "$DIR/kwok.pid")" 2>/dev/null || true
  rm -f "$DIR/kwok.pid"
  kind delete cluster --name "$NAME" || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export KUBECONFIG=$DIR/kubeconfig"; echo "export TPUTORCH_USE_EXISTING_CLUSTER=1" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
