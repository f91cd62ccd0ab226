#!/usr/bin/env bash
# make test: every test, in two pytest runs side by side.
#   tests/cluster     the local cluster's tests, in the foreground: the suite's critical path (~43 min),
#                     mostly waiting on the API server, KubeRay, Ray heads and vLLM starts
#   everything else   unit, image, packaging, serving and tests/raysim (~10 min, CPU-bound), in the
#                     background at a lower CPU priority (nice), so it fills the cluster run's waits
#                     without slowing it; its output follows the cluster run's
# Each run has a temp root of its own under the run's (TMPDIR, RAY_TMPDIR, pytest's base temp; issue
# 31), so neither sees what the other, or an earlier run, left in /tmp; removed afterwards unless
# KEEP_TMP=1. Exits non-zero if either run failed.
# Usage: hack/test.sh [extra pytest args for both runs]
set -uo pipefail

PY=${PYTHON:-.venv/bin/python}
run=$(mktemp -d "${RUN_TMP_ROOT:-/tmp}/tt-run-XXXXXX")
echo "make test: this run's temp root is $run"
mkdir -p "$run/cluster" "$run/local"

in_own_tmp() {  # in_own_tmp <dir> <command...>
  local dir=$1; shift
  TMPDIR=$dir RAY_TMPDIR=$dir "$@"
}

start=$SECONDS
in_own_tmp "$run/local" nice -n "${LOCAL_NICE:-5}" "$PY" -m pytest tests --ignore=tests/cluster \
  --basetemp="$run/local/pytest" --durations=20 "$@" >"$run/local.log" 2>&1 &
local_pid=$!
# A background job of a script ignores Ctrl-C: stop it with the foreground run (Ray's reaper takes
# its Ray processes along).
trap 'kill -TERM "$local_pid" 2>/dev/null; exit 130' INT TERM
echo "make test: tests outside tests/cluster run beside it (pid $local_pid, nice ${LOCAL_NICE:-5}); their output follows"

in_own_tmp "$run/cluster" "$PY" -m pytest tests/cluster --basetemp="$run/cluster/pytest" --durations=40 "$@"
cluster_rc=$?
cluster_s=$((SECONDS - start))

wait "$local_pid"
local_rc=$?
echo
echo "================ tests outside tests/cluster (ran beside the cluster tests) ================"
cat "$run/local.log"
echo "make test: tests/cluster exit $cluster_rc after ${cluster_s}s; the others exit $local_rc; all done after $((SECONDS - start))s"

if [ -z "${KEEP_TMP:-}" ]; then rm -rf "$run"; fi
[ "$cluster_rc" -eq 0 ] && [ "$local_rc" -eq 0 ]
