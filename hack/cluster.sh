#!/usr/bin/env bash
# A real local Kubernetes control plane without Docker, for the integration/e2e tests and the demo.
#
#   hack/cluster.sh up [--fresh]   build/reuse binaries, start everything, wait until ready
#                                  (--fresh: wipe etcd data first = an empty cluster)
#   KUEUE=1 hack/cluster.sh up     the same, plus Kueue (off by default; a running Kueue is left
#                                  running by a later `up` without KUEUE=1, stopped by `down`);
#                                  KUEUE_FRAMEWORKS="ray.io/rayjob ..." its integrations (default:
#                                  rayjob, raycluster, rayservice; a running Kueue with others restarts)
#   hack/cluster.sh kueue          only (re)start Kueue on a running cluster, as KUEUE=1 `up` would
#                                  (with KUEUE_FRAMEWORKS: a quicker way to switch its integrations)
#   hack/cluster.sh down           stop every process `up` started (pid files); idempotent
#   hack/cluster.sh status         one line per component
#   hack/cluster.sh env            print `export KUBECONFIG=... TPUTORCH_DASHBOARD_URL=... TPUTORCH_BIN=...`
#                                  (eval "$(hack/cluster.sh env)")
#
# Components: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (k8s v1.34.4),
# KWOK (fake kubelets for the nodes in hack/nodes.yaml), a fake Ray dashboard
# (hack/fakedash, started by hack/fake_dashboard.py), a stand-in for the GKE Ray TPU webhook's pod
# mutation (hack/tpu_webhook.py, HTTPS on 127.0.0.1) and the KubeRay operator (out of cluster,
# HTTP_PROXY -> fake dashboard); with KUEUE=1 also Kueue's controller (out of cluster, webhooks on
# 127.0.0.1 with the local CA).
# Everything binds to 127.0.0.1. State: ${TPUTORCH_CLUSTER_DIR:-<repo>/.cluster}.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HACK")
DIR=${TPUTORCH_CLUSTER_DIR:-$REPO/.cluster}
PY=${PYTHON:-python3}
KUBECTL=${KUBECTL:-kubectl}
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok fake-dashboard tpu-webhook kuberay-operator kueue)
OPTIONAL=" kueue "   # components that only run when asked for (status does not fail on them)

log() { echo "[cluster $(date +%H:%M:%S)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# free_port: a loopback port free now that nothing else will be handed later. The components bind
# their ports again at every restart, up to an hour after `up` picked them: a port from the kernel's
# ephemeral range (ip_local_port_range, 32768-60999 by default) can by then be some client's local
# port, and Ray's workers take 10002-19999. So ports come from 20000-32767, and never one that this
# cluster's ports.env already holds (CI once saw Kueue never become ready 40 minutes in).
free_port() {
  "$PY" - "$DIR/ports.env" <<'PYEOF'
import random, re, socket, sys
try:
    taken = {int(p) for p in re.findall(r"=(\d+)", open(sys.argv[1]).read())}
except OSError:
    taken = set()
lo, hi = 20000, 32767
try:
    eph = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
    hi = min(hi, int(eph[0]) - 1)
except (OSError, ValueError, IndexError):
    pass
if hi < lo:  # an ephemeral range reaching below 20000 leaves no safe range: take what the kernel gives
    lo = hi = 0
for port in random.sample(range(lo, hi + 1), hi - lo + 1):
    if port in taken:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(s.getsockname()[1])
    break
else:
    sys.exit(f"no free port in 127.0.0.1:{lo}-{hi}")
PYEOF
}

pidfile() { echo "$DIR/pids/$1.pid"; }
# running <pid>: exists and is not a zombie (an exited child waits for its reaper as a zombie)
running() { [[ -n $1 && -r /proc/$1/stat ]] && [[ $(cut -d')' -f2 "/proc/$1/stat" 2>/dev/null | awk '{print $1}') != Z ]]; }
# alive <component>: the pid in its pid file runs and is still the program we started.
alive() {
  local f pid; f=$(pidfile "$1"); [[ -f $f ]] || return 1
  pid=$(cat "$f"); running "$pid" || return 1
  grep -qa -- "$(cat "$f.cmd" 2>/dev/null || echo "$1")" "/proc/$pid/cmdline" 2>/dev/null
}

# start <component> <program> [args...]: run in the background, own session, log to logs/<c>.log
start() {
  local name=$1; shift
  if alive "$name"; then log "$name already running (pid $(cat "$(pidfile "$name")"))"; return 0; fi
  log "starting $name"
  setsid nohup "$@" >>"$DIR/logs/$name.log" 2>&1 </dev/null 8>&- &
  echo $! >"$(pidfile "$name")"
  local marker=$1; [[ $marker == *python* ]] && marker=$2
  echo "$marker" >"$(pidfile "$name").cmd"   # what /proc/<pid>/cmdline must contain
}

# wait_for <what> <seconds> <command...>
# A component that exits while waited for fails at once; either way its log's tail is printed,
# since CI keeps only what the test run printed.
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    # Its pid, not its command line: until the started process has exec'd, its command line is
    # still this script's (a first run that checked `alive` here called a starting Kueue exited).
    if [[ -f $(pidfile "$what") ]] && ! running "$(cat "$(pidfile "$what")")"; then
      log_tail "$what"; die "$what exited while starting (see $DIR/logs/$what.log)"
    fi
    if ((SECONDS >= end)); then log_tail "$what"; die "timed out after ${secs}s waiting for $what (see $DIR/logs/)"; fi
    sleep 0.5
  done
}
log_tail() {
  local f=$DIR/logs/$1.log
  [[ -f $f ]] || return 0
  log "last lines of $f:"; tail -n 25 "$f" | sed 's/^/    /' >&2
}

load_env() { [[ -f $DIR/ports.env ]] && source "$DIR/ports.env"; return 0; }

ports() {  # pick free ports once; reused by every later `up` so the kubeconfig stays valid
  load_env
  if [[ -z ${APISERVER_PORT:-} ]]; then
    {
      echo "ETCD_PORT=$(free_port)"; echo "ETCD_PEER_PORT=$(free_port)"
      echo "APISERVER_PORT=$(free_port)"; echo "KCM_PORT=$(free_port)"; echo "SCHEDULER_PORT=$(free_port)"
      echo "KWOK_PORT=$(free_port)"; echo "DASHBOARD_PORT=$(free_port)"; echo "KUBERAY_PROBE_PORT=$(free_port)"
    } >"$DIR/ports.env"
    load_env
  fi
  if [[ -z ${KUEUE_WEBHOOK_PORT:-} ]]; then   # added later than the rest: older ports.env lack it
    { echo "KUEUE_WEBHOOK_PORT=$(free_port)"; echo "KUEUE_PROBE_PORT=$(free_port)"; } >>"$DIR/ports.env"
    load_env
  fi
  if [[ -z ${TPU_WEBHOOK_PORT:-} ]]; then   # likewise
    echo "TPU_WEBHOOK_PORT=$(free_port)" >>"$DIR/ports.env"
    load_env
  fi
}

certs() {
  local p=$DIR/pki
  [[ -f $p/apiserver.crt && -f $p/sa.key && -f $DIR/token ]] && return 0
  log "generating CA, API server certificate, service-account keys and admin token"
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=tputorch-local-ca" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$p/apiserver.key" \
    -out "$p/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' >"$p/apiserver.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
    -extfile "$p/apiserver.ext" -out "$p/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  "$PY" -c 'import secrets; print(secrets.token_hex(24))' >"$DIR/token"
  # token,user,uid,"groups": the admin is in system:masters
  echo "$(cat "$DIR/token"),admin,admin,\"system:masters\"" >"$p/tokens.csv"
  chmod 600 "$p"/*.key "$p/tokens.csv" "$DIR/token"
}

kubeconfig() {
  cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tputorch-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$DIR/token")
contexts:
- name: tputorch-local
  context: {cluster: tputorch-local, user: admin}
current-context: tputorch-local
EOF
  chmod 600 "$DIR/kubeconfig"
}

k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }
https_ok() { curl -sfk --noproxy '*' --max-time 2 "$1"; }
api_ready() {
  curl -sf --noproxy '*' --max-time 2 --cacert "$DIR/pki/ca.crt" \
    -H "Authorization: Bearer $(cat "$DIR/token")" "https://127.0.0.1:$APISERVER_PORT/readyz"
}
nodes_ready() {
  local want got
  want=$(grep -c '^  kind: Node' "$HACK/nodes.yaml")
  got=$(k get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)
  [[ $got -ge $want ]]
}

kwok_dir() {  # KWOK's module in the Go module cache (its CRDs; the binary came from there too)
  (cd /tmp && go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION:-v0.7.0}" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}

# `kubectl logs` for fake pods: the API server reads logs from a node's kubelet endpoint, which
# for KWOK's nodes is KWOK's own server (HTTPS on KWOK_PORT, set as each node's kubelet port). What
# it serves per pod comes from KWOK's Logs / ClusterLogs objects (a CRI-format file per container).
kwok_logs_setup() {
  local crds stamp="$DIR/etcd/.kwok-log-crds"
  crds=$(kwok_dir)/kustomize/crd/bases
  if [[ $(cat "$stamp" 2>/dev/null) != "$crds" ]] || ! k get crd logs.kwok.x-k8s.io clusterlogs.kwok.x-k8s.io >/dev/null 2>&1; then
    log "installing KWOK's Logs and ClusterLogs CRDs"
    k apply --server-side --force-conflicts -f "$crds/kwok.x-k8s.io_logs.yaml" -f "$crds/kwok.x-k8s.io_clusterlogs.yaml" >/dev/null
    echo "$crds" >"$stamp"
  fi
}
kwok_nodes_port() {  # KWOK sets the kubelet port only on a node's first start: older nodes get it here
  local n
  for n in $(k get nodes -l type=kwok -o jsonpath="{range .items[?(@.status.daemonEndpoints.kubeletEndpoint.Port!=$KWOK_PORT)]}{.metadata.name}{' '}{end}"); do
    k patch node "$n" --subresource=status --type=merge \
      -p "{\"status\":{\"daemonEndpoints\":{\"kubeletEndpoint\":{\"Port\":$KWOK_PORT}}}}" >/dev/null
  done
}

# Another KubeRay than hack/build.sh's (the support matrix's other versions, e.g. one built from its
# source tag when the Go module proxy refuses its zip: hack/kuberay-from-source.sh):
# TPUTORCH_KUBERAY_SOURCE=<its ray-operator directory, holding config/crd/bases and kuberay-operator>.
kuberay_binary() {
  if [[ -n ${TPUTORCH_KUBERAY_SOURCE:-} ]]; then echo "$TPUTORCH_KUBERAY_SOURCE/kuberay-operator"; else echo "$BIN/kuberay-operator"; fi
}

kuberay_dir() {
  if [[ -n ${TPUTORCH_KUBERAY_SOURCE:-} ]]; then echo "$TPUTORCH_KUBERAY_SOURCE"; return; fi
  local v; v=$(cat "$BIN/kuberay-operator.version" 2>/dev/null || echo v1.6.2)
  (cd /tmp && go mod download -json "github.com/ray-project/kuberay/ray-operator@$v" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}

# The module of the Kueue that hack/build.sh built: its CRDs and webhooks must be that version's.
kueue_dir() {
  local v; v=$(basename "$1"); v=${v#kueue-}; v=${v%%_*}
  (cd /tmp && go mod download -json "sigs.k8s.io/kueue@$v" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
}

# The stand-in TPU webhook (hack/tpu_webhook.py) for KubeRay's pods, as GKE's add-on registers its
# own; failurePolicy Ignore: with the stand-in down, pods come without the variables and the
# operator's status says the webhook is missing. A namespace labelled tputorch.io/tpu-webhook=off
# is left out (tests: GKE without the webhook).
tpu_webhook_config() {
  k apply -f - >/dev/null <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: tputorch-local-tpu-webhook
webhooks:
- name: tpu-pods.tputorch.local
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  timeoutSeconds: 10
  clientConfig:
    url: https://127.0.0.1:$TPU_WEBHOOK_PORT/mutate
    caBundle: $(base64 -w0 <"$DIR/pki/ca.crt")
  rules:
  - {operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods], scope: Namespaced}
  objectSelector:
    matchLabels: {app.kubernetes.io/name: kuberay}
  namespaceSelector:
    matchExpressions: [{key: tputorch.io/tpu-webhook, operator: NotIn, values: ["off"]}]
EOF
}

# Without Kueue its webhooks (failurePolicy Fail) would refuse every RayJob: a cluster started
# with KUEUE=1 earlier keeps them in etcd, so an `up` without Kueue running removes them.
kueue_webhooks_off() {
  k delete mutatingwebhookconfiguration kueue-mutating-webhook-configuration --ignore-not-found >/dev/null
  k delete validatingwebhookconfiguration kueue-validating-webhook-configuration --ignore-not-found >/dev/null
}

kueue_ready() { curl -sf --noproxy '*' --max-time 2 "http://127.0.0.1:$KUEUE_PROBE_PORT/readyz"; }

# Kueue's controller, out of cluster: its own serving certificate from the local CA (SAN 127.0.0.1)
# instead of its internal cert management (which names a Service that nothing routes here), CRDs
# and webhook configurations from the module cache (hack/kueue_manifests.py), the RayJob,
# RayCluster and RayService integrations. v0.17 reads the metrics certificate from the fixed path
# /etc/kueue/metrics/certs when its internal cert management is off; rather than writing into the
# host's /etc, Kueue runs in a private mount namespace where /etc is an overlay holding that file.
kueue_up() {
  local kbin mod p=$DIR/pki run=$DIR/run/kueue
  kbin=$("$HACK/build.sh" kueue | tail -1)
  mod=$(kueue_dir "$kbin")
  mkdir -p "$run/certs" "$run/ns"
  if [[ ! -f $run/certs/tls.crt ]]; then
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kueue-webhook" -keyout "$run/certs/tls.key" \
      -out "$run/certs/tls.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$run/certs/tls.ext"
    openssl x509 -req -in "$run/certs/tls.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
      -days 3650 -extfile "$run/certs/tls.ext" -out "$run/certs/tls.crt" 2>/dev/null
    chmod 600 "$run/certs/tls.key"
  fi
  local fw frameworks=""
  for fw in ${KUEUE_FRAMEWORKS:-ray.io/rayjob ray.io/raycluster ray.io/rayservice}; do
    frameworks+="${frameworks:+, }\"$fw\""
  done
  cat >"$run/config.new.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_PROBE_PORT
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $run/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: [$frameworks]
featureGates:
  VisibilityOnDemand: false
EOF
  # Kueue reads its config at start: one running with another config is restarted with this one.
  if alive kueue && ! cmp -s "$run/config.new.yaml" "$run/config.yaml"; then
    local pid; pid=$(cat "$(pidfile kueue)"); log "restarting kueue (pid $pid) with integrations [$frameworks]"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  mv "$run/config.new.yaml" "$run/config.yaml"
  local stamp="$DIR/etcd/.kueue-crds" want="$mod $KUEUE_WEBHOOK_PORT"
  if [[ $(cat "$stamp" 2>/dev/null) == "$want" ]] && k get crd workloads.kueue.x-k8s.io >/dev/null 2>&1; then
    log "Kueue CRDs already installed"
  else
    log "installing Kueue CRDs from $mod"
    "$PY" "$HACK/kueue_manifests.py" crds "$mod" "$KUEUE_WEBHOOK_PORT" "$p/ca.crt" >"$run/crds.yaml"
    k create --validate=false -f "$run/crds.yaml" >/dev/null 2>&1 || k replace --validate=false -f "$run/crds.yaml" >/dev/null
    echo "$want" >"$stamp"
  fi
  # Kueue's manager fails at start on a kind the API server does not serve yet.
  k wait --for=condition=Established --timeout=60s -f "$run/crds.yaml" >/dev/null
  k get namespace kueue-system >/dev/null 2>&1 || k create namespace kueue-system >/dev/null
  "$PY" "$HACK/kueue_manifests.py" webhooks "$mod" "$KUEUE_WEBHOOK_PORT" "$p/ca.crt" >"$run/webhooks.yaml"
  if ! alive kueue; then
    # shellcheck disable=SC2016
    KUBECONFIG="$DIR/kubeconfig" start kueue unshare --mount --propagation private sh -c '
      set -e; mount -t tmpfs tmpfs "$1"; mkdir -p "$1/upper/kueue/metrics/certs" "$1/work"
      cp "$2"/tls.crt "$2"/tls.key "$1/upper/kueue/metrics/certs/"
      mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
      exec "$3" --config="$4" --zap-log-level=${KUEUE_LOG_LEVEL:-info}' kueue "$run/ns" "$run/certs" "$kbin/kueue" "$run/config.yaml"
    echo "$run/config.yaml" >"$(pidfile kueue).cmd"   # what the exec'd kueue's cmdline holds
  fi
  wait_for kueue 120 kueue_ready
  # The webhooks go in once Kueue serves them (failurePolicy Fail).
  k apply --server-side --force-conflicts -f "$run/webhooks.yaml" >/dev/null
  # The config it runs with, where Kueue's own install keeps it (its manager mounts this ConfigMap),
  # for what reads it there (tputorch doctor's integrations check).
  k create configmap kueue-manager-config -n kueue-system --from-file=controller_manager_config.yaml="$run/config.yaml" \
    --dry-run=client -o yaml | k apply --server-side --force-conflicts -f - >/dev/null
}

cmd_up() {
  local fresh=0 t0=$SECONDS
  [[ ${1:-} == --fresh ]] && fresh=1
  BIN=$("$HACK/build.sh" cluster | tail -1)
  # the stand-in dashboard's NetworkPolicy engine (hack/fakedash/network.py; warm: at once)
  "$HACK/build.sh" cyclonus >/dev/null || log "cyclonus did not build: NetworkPolicies are not enforced"
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/etcd" "$DIR/run"
  if ((fresh)); then
    cmd_down
    log "--fresh: wiping etcd data"
    rm -rf "$DIR/etcd"; mkdir -p "$DIR/etcd"
  fi
  ports; certs; kubeconfig
  local p=$DIR/pki

  start etcd "$BIN/etcd" --name=tputorch-local --data-dir="$DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="tputorch-local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync=true --quota-backend-bytes=4294967296 --log-level=warn
  wait_for etcd 60 curl -sf --noproxy '*' --max-time 2 "http://127.0.0.1:$ETCD_PORT/health"

  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --token-auth-file="$p/tokens.csv" --authorization-mode=RBAC \
    --service-cluster-ip-range=10.96.0.0/16 --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --endpoint-reconciler-type=none --allow-privileged=true --enable-priority-and-fairness=false \
    --enable-admission-plugins=OwnerReferencesPermissionEnforcement \
    --kubelet-preferred-address-types=InternalIP \
    --profiling=false --cert-dir="$DIR/run/apiserver" --v=1 \
    --audit-policy-file="$HACK/audit-policy.yaml" --audit-log-path="$DIR/logs/audit.log" \
    --audit-log-maxsize=100 --audit-log-maxbackup=1
  wait_for kube-apiserver 120 api_ready

  # KWOK's kubelets are one process that a busy machine (a real Ray head, builds) can starve: with
  # the default grace period its nodes went NotReady now and then, the node lifecycle controller
  # set every pod Ready=False and nothing set them back (hack/README.md, "Node health"). A long
  # grace period, and node leases that KWOK renews often, keep them Ready.
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$DIR/kubeconfig" \
    --authentication-kubeconfig="$DIR/kubeconfig" --authorization-kubeconfig="$DIR/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$DIR/run/kcm" --leader-elect=false \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --use-service-account-credentials=false --controllers='*' --profiling=false --v=1 \
    --node-monitor-grace-period="${TPUTORCH_NODE_GRACE:-300s}"
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$DIR/kubeconfig" \
    --authentication-kubeconfig="$DIR/kubeconfig" --authorization-kubeconfig="$DIR/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
    --cert-dir="$DIR/run/scheduler" --leader-elect=false --profiling=false --v=1
  wait_for kube-controller-manager 60 https_ok "https://127.0.0.1:$KCM_PORT/healthz"
  wait_for kube-scheduler 60 https_ok "https://127.0.0.1:$SCHEDULER_PORT/healthz"

  # CRDs and nodes live in etcd: skip when this etcd data already has them (warm start).
  local crds stamp="$DIR/etcd/.kuberay-crds"
  crds=$(kuberay_dir)/config/crd/bases
  if [[ $(cat "$stamp" 2>/dev/null) == "$crds" ]] && k get crd rayclusters.ray.io rayjobs.ray.io rayservices.ray.io >/dev/null 2>&1; then
    log "KubeRay CRDs already installed"
  else
    log "installing KubeRay CRDs from $crds"
    # ~1 MB each: create (or replace), never client-side apply (annotation too large); server-side
    # apply works too but is ~3x slower here.
    k create --validate=false -f "$crds" >/dev/null 2>&1 || k replace --validate=false -f "$crds" >/dev/null
    echo "$crds" >"$stamp"
  fi
  if [[ $(k get nodes -l type=kwok -o name | wc -l) -ge $(grep -c '^  kind: Node' "$HACK/nodes.yaml") ]]; then
    log "nodes from hack/nodes.yaml already there"
  else
    log "creating nodes from hack/nodes.yaml"
    k create --validate=false -f "$HACK/nodes.yaml" 2>&1 | grep -v AlreadyExists >&2 || true
  fi

  kwok_logs_setup
  start kwok "$BIN/kwok" --kubeconfig="$DIR/kubeconfig" --config="$HACK/kwok-pod-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --server-address="127.0.0.1:$KWOK_PORT" --node-port="$KWOK_PORT" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --enable-crds=Logs,ClusterLogs \
    --node-lease-duration-seconds=40
  wait_for "nodes Ready (kwok)" 60 nodes_ready
  kwok_nodes_port

  start fake-dashboard "$PY" "$HACK/fake_dashboard.py" --port="$DASHBOARD_PORT" \
    --kube-server="https://127.0.0.1:$APISERVER_PORT" --kube-token-file="$DIR/token" --kube-ca="$p/ca.crt" \
    --submitter-log-dir="$DIR/logs/submitters" --ray-bin="${TPUTORCH_RAY_BIN:-$REPO/.venv/bin}"
  wait_for fake-dashboard 30 curl -sf --noproxy '*' --max-time 2 "http://127.0.0.1:$DASHBOARD_PORT/_control/healthz"

  start tpu-webhook "$PY" "$HACK/tpu_webhook.py" --port="$TPU_WEBHOOK_PORT" \
    --cert="$p/apiserver.crt" --key="$p/apiserver.key"
  wait_for tpu-webhook 30 curl -sf --noproxy '*' --max-time 2 --cacert "$p/ca.crt" "https://127.0.0.1:$TPU_WEBHOOK_PORT/healthz"
  tpu_webhook_config

  # Go's HTTP client proxies every non-loopback host: the dashboard calls go to the fake; the
  # API server (127.0.0.1) is never proxied (loopback, and NO_PROXY too).
  (
    export KUBECONFIG="$DIR/kubeconfig" HTTP_PROXY="http://127.0.0.1:$DASHBOARD_PORT" http_proxy="http://127.0.0.1:$DASHBOARD_PORT"
    export NO_PROXY="127.0.0.1,localhost,::1" no_proxy="127.0.0.1,localhost,::1"
    unset HTTPS_PROXY https_proxy ALL_PROXY all_proxy
    start kuberay-operator "$(kuberay_binary)" \
      --enable-leader-election=false --metrics-addr=0 --health-probe-bind-address="127.0.0.1:$KUBERAY_PROBE_PORT" \
      --feature-gates=RayMultiHostIndexing=true --log-stdout-encoder=console
  )
  wait_for kuberay-operator 60 curl -sf --noproxy '*' --max-time 2 "http://127.0.0.1:$KUBERAY_PROBE_PORT/readyz"

  if [[ ${KUEUE:-0} == 1 ]]; then
    kueue_up
  elif ! alive kueue; then
    kueue_webhooks_off
  fi

  if [[ ! -x $BIN/helm && ${TPUTORCH_BUILD_HELM:-1} == 1 ]]; then  # for the chart tests; not needed by the cluster
    log "building helm in the background (log: $DIR/logs/build-helm.log)"
    nohup "$HACK/build.sh" helm >>"$DIR/logs/build-helm.log" 2>&1 </dev/null 8>&- &
  fi
  log "cluster up in $((SECONDS - t0))s; eval \"\$($0 env)\""
}

cmd_kueue() {  # Kueue alone, without the rest of `up`'s checks (a test switching its integrations)
  load_env
  [[ -n ${APISERVER_PORT:-} ]] && api_ready >/dev/null 2>&1 || die "no running cluster in $DIR (run: KUEUE=1 $0 up)"
  local t0=$SECONDS
  kueue_up
  log "kueue up in $((SECONDS - t0))s"
}

cmd_down() {
  local i name f pid
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    name=${COMPONENTS[i]}; f=$(pidfile "$name")
    [[ -f $f ]] || continue
    if alive "$name"; then
      pid=$(cat "$f"); log "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
      if running "$pid"; then log "$name did not stop; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$f" "$f.cmd"
  done
  return 0
}

cmd_status() {
  load_env
  local name rc=0
  for name in "${COMPONENTS[@]}"; do
    if alive "$name"; then printf '%-24s running  pid %s\n' "$name" "$(cat "$(pidfile "$name")")"
    elif [[ $OPTIONAL == *" $name "* ]]; then printf '%-24s off\n' "$name"
    else printf '%-24s stopped\n' "$name"; rc=1; fi
  done
  [[ -n ${APISERVER_PORT:-} ]] && echo "api server: https://127.0.0.1:$APISERVER_PORT  dashboard: http://127.0.0.1:$DASHBOARD_PORT"
  return $rc
}

cmd_env() {
  load_env
  [[ -n ${APISERVER_PORT:-} ]] || die "no cluster state in $DIR (run: $0 up)"
  echo "export KUBECONFIG=$DIR/kubeconfig"
  echo "export TPUTORCH_DASHBOARD_URL=http://127.0.0.1:$DASHBOARD_PORT"
  echo "export TPUTORCH_CLUSTER_DIR=$DIR"
  echo "export TPUTORCH_BIN=$("$HACK/build.sh" dir)   # etcd, kube-*, kwok, kuberay-operator, helm"
  echo "export TPUTORCH_KUEUE_BIN=$("$HACK/build.sh" kueue-dir)"
}

# One up/down at a time per state dir. Started components get fd 8 closed (see start()), so they
# never hold the lock; -w keeps a stuck holder from hanging callers forever.
lock() {
  mkdir -p "$DIR"; exec 8>"$DIR/cluster.lock"
  flock -w 600 8 || die "another hack/cluster.sh holds $DIR/cluster.lock for 10 minutes"
}

case "${1:-}" in
  up) shift; lock; cmd_up "$@" ;;
  kueue) lock; cmd_kueue ;;
  down) lock; cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 up [--fresh] | kueue | down | status | env" >&2; exit 2 ;;
esac
