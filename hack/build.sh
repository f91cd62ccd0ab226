#!/usr/bin/env bash
# Builds (or reuses) the local-cluster binaries into
#   ${TPUTORCH_CACHE:-$HOME/.cache/tputorch}/bin/<versionkey>/
# Usage: hack/build.sh [cluster|helm|kueue|cyclonus|all|key|dir|kueue-dir|cyclonus-dir]
#        (default: all: cluster, helm, kueue, cyclonus)
#   cluster  etcd, kube-apiserver/-controller-manager/-scheduler, kwok, kuberay-operator
#   helm     helm only
#   kueue    Kueue's controller only, into its own directory ${CACHE}/bin/<kueue key>/ under its own
#            lock: adding or bumping Kueue never invalidates (or waits for) the binaries above
#   cyclonus the NetworkPolicy engine the local chain asks whether a connection to a Ray pod is
#            admitted (hack/netpolicy.py), into ${CACHE}/bin/<cyclonus key>/ under its own lock
#   key|dir  print the version key / the bin directory and exit (kueue-dir, cyclonus-dir: theirs)
# Everything is built from Go modules through the Go module proxy; nothing is downloaded otherwise.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
KUBERAY_VERSION=${KUBERAY_VERSION:-v1.6.2}
KUBERAY_FALLBACKS=${KUBERAY_FALLBACKS:-}   # versions to try if the one above does not build
HELM_VERSION=${HELM_VERSION:-v3.22.0}
KUEUE_VERSION=${KUEUE_VERSION:-v0.19.1}
CYCLONUS_VERSION=${CYCLONUS_VERSION:-v0.5.6}

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${TPUTORCH_CACHE:-$HOME/.cache/tputorch}
GOV=$(go env GOVERSION)
# etcd's version is the one k8s.io/kubernetes pins; it is derived, so k8s' version covers it.
KEY="k8s-${K8S_VERSION}_kwok-${KWOK_VERSION}_kuberay-${KUBERAY_VERSION}_helm-${HELM_VERSION}_${GOV}"
BIN="$CACHE/bin/$KEY"
KUEUE_BIN="$CACHE/bin/kueue-${KUEUE_VERSION}_${GOV}"
CYCLONUS_BIN="$CACHE/bin/cyclonus-${CYCLONUS_VERSION}_${GOV}"
LOGS="$CACHE/logs"

what=${1:-all}
case "$what" in
  key) echo "$KEY"; exit 0 ;;
  dir) echo "$BIN"; exit 0 ;;
  kueue-dir) echo "$KUEUE_BIN"; exit 0 ;;
  cyclonus-dir) echo "$CYCLONUS_BIN"; exit 0 ;;
  cluster|helm|kueue|cyclonus|all) ;;
  *) echo "usage: $0 [cluster|helm|kueue|cyclonus|all|key|dir|kueue-dir|cyclonus-dir]" >&2; exit 2 ;;
esac

log() { echo "[build $(date +%H:%M:%S)] $*" >&2; }
timed() { local t0=$SECONDS; "$@"; log "$1 ${2:-}: $((SECONDS - t0))s"; }

# A binary in a directory of its own (its own version key) under a lock of its own, so that a
# cluster build in progress does not hold it up and it does not hold that one up.
own_install() {  # own_install <dir> <binary> <lock name> <ldflags> <module/cmd path>@<version>
  local dir=$1 name=$2 lock=$3 ld=$4 spec=$5
  mkdir -p "$CACHE"
  ( exec 7>"$CACHE/$lock.lock"; flock 7; t0=$SECONDS
    if [[ ! -x "$dir/$name" ]]; then
      mkdir -p "$dir"
      log "go install $spec"
      (cd /tmp && GOBIN="$dir/.tmp" go install -trimpath -ldflags "$ld" "$spec")
      mv "$dir/.tmp/$name" "$dir/$name"; rmdir "$dir/.tmp"
    fi
    log "$name: $((SECONDS - t0))s" )
}
# Kueue's controller (cmd/kueue; its go.mod has no replace lines, so `go install` works; cold:
# ~7 min on 2 busy cores).
with_kueue_lock() {
  own_install "$KUEUE_BIN" kueue "build-kueue-$KUEUE_VERSION" "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
}
# cyclonus: a NetworkPolicy engine (`cyclonus analyze --mode query-traffic`; ~2 min cold).
with_cyclonus_lock() {
  own_install "$CYCLONUS_BIN" cyclonus build-cyclonus "-s -w" "github.com/mattfenwick/cyclonus/cmd/cyclonus@$CYCLONUS_VERSION"
}
case "$what" in
  kueue) with_kueue_lock; echo "$KUEUE_BIN"; exit 0 ;;
  cyclonus) with_cyclonus_lock; echo "$CYCLONUS_BIN"; exit 0 ;;
esac

mkdir -p "$BIN" "$LOGS"
exec 9>"$CACHE/build.lock"
flock 9   # one build at a time per cache

build_kube() {
  [[ -x "$BIN/kube" && -x "$BIN/etcd" ]] && return 0
  log "building kubernetes $K8S_VERSION control plane + etcd (cold: tens of minutes)"
  local src="$HACK/cluster-bin" pkg=k8s.io/component-base/version
  K8S_VERSION=$K8S_VERSION "$src/gen-gomod.sh" >/dev/null
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$src" && go mod tidy && \
    go build -trimpath -ldflags "$ld" -o "$BIN/kube.tmp" ./kube && mv "$BIN/kube.tmp" "$BIN/kube" && \
    go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" ./etcd && mv "$BIN/etcd.tmp" "$BIN/etcd")
  for c in kube-apiserver kube-controller-manager kube-scheduler; do ln -sf kube "$BIN/$c"; done
}

gobin_install() {  # gobin_install <binary name> <module/cmd path>@<version>
  local name=$1 spec=$2
  [[ -x "$BIN/$name" ]] && return 0
  log "go install $spec"
  (cd /tmp && GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "$spec")
}

build_kwok() { gobin_install kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"; }

build_kuberay() {
  [[ -x "$BIN/kuberay-operator" ]] && return 0
  local v
  for v in "$KUBERAY_VERSION" $KUBERAY_FALLBACKS; do
    log "go install github.com/ray-project/kuberay/ray-operator@$v"
    if (cd /tmp && GOBIN="$BIN/.kuberay" go install -trimpath -ldflags "-s -w" \
          "github.com/ray-project/kuberay/ray-operator@$v"); then
      mv "$BIN/.kuberay/ray-operator" "$BIN/kuberay-operator"; rmdir "$BIN/.kuberay"
      echo "$v" > "$BIN/kuberay-operator.version"
      [[ $v == "$KUBERAY_VERSION" ]] || log "WARNING: kuberay $KUBERAY_VERSION failed; using $v"
      return 0
    fi
    log "kuberay $v failed"
  done
  return 1
}

build_helm() { gobin_install helm "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"; }

t0=$SECONDS
if [[ $what == cluster || $what == all ]]; then
  timed build_kwok
  timed build_kuberay
  timed build_kube
fi
if [[ $what == helm || $what == all ]]; then
  timed build_helm
fi
if [[ $what == all ]]; then
  exec 9>&-   # the cluster binaries are done: others may use that lock while Kueue builds
  with_kueue_lock
  with_cyclonus_lock
fi
log "done in $((SECONDS - t0))s: $BIN"
echo "$BIN"
