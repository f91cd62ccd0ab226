#!/usr/bin/env bash
# The first thing to run: a v6e 4x4 TPUTorchJob from apply to Succeeded on the local cluster.
#
# Brings the local cluster up (hack/cluster.sh), installs the CRD, starts the operator, submits
# examples/v6e-4x4.yaml with `tputorch submit`, which shows it going Pending -> Running (4/4 hosts)
# -> Succeeded and exits 0; then the RayJob, RayCluster and the pods on their fake TPU nodes, and a
# TPUTorchService to Ready. The fake Ray dashboard plays the Ray job's part; with REAL_RAY=1 a real
# Ray head and four simulated TPU hosts run a small Ray Train job instead (hack/demo_real_ray.py)
# and its output is printed; then a TPUTorchService for a tiny model goes through KubeRay to Ray
# Serve LLM and vLLM 0.29 on CPU on a real Ray head, and a completion from its endpoint is printed. Everything started here is stopped at the end (DEMO_KEEP=1 keeps the cluster).
set -euo pipefail
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HACK")
PY=${PYTHON:-python3}
NS=tputorch-demo
JOB=llama-v6e-4x4

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

WAS_RUNNING=0
"$HACK/cluster.sh" status >/dev/null 2>&1 && WAS_RUNNING=1
"$HACK/cluster.sh" up
eval "$("$HACK/cluster.sh" env)"
DIR=${TPUTORCH_CLUSTER_DIR:-$REPO/.cluster}
OPLOG=$DIR/logs/operator.log
OP_PID=
HELPER_PID=
cleanup() {
  [[ -n $HELPER_PID ]] && kill "$HELPER_PID" 2>/dev/null || true
  [[ -n $OP_PID ]] && kill "$OP_PID" 2>/dev/null && wait "$OP_PID" 2>/dev/null || true
  # Stop the cluster only if this demo started it (DEMO_KEEP=1 keeps it for a look around).
  if [[ ${DEMO_KEEP:-0} != 1 && $WAS_RUNNING == 0 ]]; then "$HACK/cluster.sh" down; else
    echo "cluster left running: eval \"\$(hack/cluster.sh env)\"; kubectl get ttj -A; hack/cluster.sh down when done"; fi
}
trap cleanup EXIT

say "Install the TPUTorchJob and TPUTorchService CRDs"
kubectl apply --server-side --force-conflicts -f "$REPO/crds/tputorch.io_tputorchjobs.yaml" \
  -f "$REPO/crds/tputorch.io_tputorchservices.yaml"
kubectl wait --for=condition=Established --timeout=60s crd/tputorchjobs.tputorch.io crd/tputorchservices.tputorch.io

say "Start the operator (log: $OPLOG)"
# The key the Ray clusters' tokens are derived from (the chart makes one into a Secret).
KEYFILE=$DIR/ray-token-key
[[ -s $KEYFILE ]] || (umask 077; "$PY" -c 'import secrets; print(secrets.token_hex(32))' >"$KEYFILE")
PYTHONPATH=$REPO/operator${PYTHONPATH:+:$PYTHONPATH} "$PY" -m tputorch run --namespace "$NS" \
  --ray-token-key-file "$KEYFILE" >>"$OPLOG" 2>&1 &
OP_PID=$!

kubectl delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kubectl create namespace "$NS"
# The examples run as the ServiceAccount ray-tpu (on GKE the one bound to a Google service account,
# docs/tasks/bucket-access.md): without it the API server refuses their pods, as GKE's does.
kubectl create serviceaccount ray-tpu -n "$NS"
if [[ ${REAL_RAY:-0} == 1 ]]; then
  "$PY" "$HACK/demo_real_ray.py" "$NS" "$REPO/examples/v6e-4x4.yaml"
  say "Demo passed"
  exit 0
fi

field() { kubectl get ttj "$JOB" -n "$NS" -o "jsonpath={.status.$1}" 2>/dev/null; }
wait_for() {  # wait_for <seconds> <phase> [hostsReady]
  local end=$((SECONDS + $1))
  until [[ $(field phase) == "$2" && ( -z ${3:-} || $(field hostsReady) == "$3" ) ]]; do
    ((SECONDS < end)) || { echo "timed out waiting for phase $2 ${3:-}"; kubectl get ttj -n "$NS" -o yaml; tail -50 "$OPLOG"; exit 1; }
    sleep 1
  done
}
tputorch() { PYTHONPATH=$REPO/operator${PYTHONPATH:+:$PYTHONPATH} "$PY" -m tputorch "$@"; }

# The stand-in Ray dashboard plays the Ray job: once the slice is up (4/4 hosts) it reports the job
# SUCCEEDED. Meanwhile this helper records what runs where, shown after the job (which frees the slice).
SNAPSHOT=$DIR/demo-running.txt
(
  wait_for 240 Running 4/4
  { kubectl get rayjob,raycluster -n "$NS"; echo
    kubectl get pods -n "$NS" -o wide \
      -o custom-columns='POD:.metadata.name,TYPE:.metadata.labels.ray\.io/node-type,NODE:.spec.nodeName,TPU:.spec.containers[0].resources.limits.google\.com/tpu,STATUS:.status.phase'
  } >"$SNAPSHOT"
  sleep 3
  PYTHONPATH=$REPO/tests/cluster "$PY" -c "from dashboard import set_job_status; set_job_status('$NS', '$JOB', 'SUCCEEDED')"
) &
HELPER_PID=$!

say "tputorch submit -f examples/v6e-4x4.yaml: live progress until the job ends"
rc=0
tputorch submit -f "$REPO/examples/v6e-4x4.yaml" -n "$NS" || rc=$?
wait "$HELPER_PID" || true
HELPER_PID=
if [[ $rc != 0 ]]; then echo "tputorch submit exited $rc"; kubectl get ttj -n "$NS" -o yaml; tail -50 "$OPLOG"; exit 1; fi

say "What ran where (recorded while the job was Running)"
cat "$SNAPSHOT"
say "tputorch get / describe"
tputorch get -n "$NS"
tputorch describe "$JOB" -n "$NS"
say "The job freed its slice; now serve an LLM on the same v6e 4x4 (examples/serve/qwen3-moe-v6e-4x4.yaml)"
SVC=qwen3-moe
end=$((SECONDS + 120))
# The slice is free when the Ray cluster's pods are gone; KubeRay's submitter pod (it carries the
# job's label too) stays Completed with its Kubernetes Job until the RayJob is deleted.
until [[ -z $(kubectl get pods -n "$NS" -l "tputorch.io/job=$JOB,ray.io/node-type" -o name) ]]; do
  ((SECONDS < end)) || { echo "the job's pods are still there"; kubectl get pods -n "$NS"; exit 1; }
  sleep 1
done
kubectl create secret generic hf-token -n "$NS" --from-literal=token=hf_demo_token_not_real
kubectl apply -n "$NS" -f "$REPO/examples/serve/qwen3-moe-v6e-4x4.yaml"
svc_field() { kubectl get ttsvc "$SVC" -n "$NS" -o "jsonpath={.status.$1}" 2>/dev/null; }
end=$((SECONDS + 300)); last=
until [[ $(svc_field phase) == Ready ]]; do
  phase=$(svc_field phase)
  [[ $phase != "$last" && -n $phase ]] && { echo "phase: $phase ($(svc_field message))"; last=$phase; }
  ((SECONDS < end)) || { echo "timed out waiting for Ready"; kubectl get ttsvc -n "$NS" -o yaml; tail -50 "$OPLOG"; exit 1; }
  sleep 1
done
echo "phase: Ready ($(svc_field message))"
kubectl get ttsvc -n "$NS"
kubectl get rayservice,svc -n "$NS"
say "The OpenAI-compatible endpoint inside the cluster: $(svc_field endpoint)"
cat <<EOF
On GKE, from your machine:
  kubectl port-forward -n $NS svc/$SVC-serve-svc 8000:8000 &
  curl http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$(svc_field model)", "messages": [{"role": "user", "content": "Hello!"}]}'
(Here the pods are simulated: nothing answers on port 8000.)
EOF
say "Delete the service: the garbage collector removes its RayService, RayCluster and pods"
# A service serves until it is deleted: left running, it would hold the slice (and this namespace's
# pods) for whatever runs on the cluster next.
kubectl delete ttsvc "$SVC" -n "$NS" --wait=true --timeout=60s
end=$((SECONDS + 120))
until [[ -z $(kubectl get pods -n "$NS" -l "tputorch.io/service=$SVC" -o name) ]]; do
  ((SECONDS < end)) || { echo "the service's pods are still there"; kubectl get pods -n "$NS"; exit 1; }
  sleep 1
done
say "Demo passed"
