#!/usr/bin/env bash
# Builds a KubeRay operator from its source tag, for a version the Go module proxy lists but will not
# serve (KubeRay v1.7.0 on 2026-12-07: v1.7.0.info resolves, v1.7.0.zip answers 403 "This module
# version is not available"), so the core path can run against it by hand:
#
#   hack/kuberay-from-source.sh <kuberay git dir> <tag, e.g. ray-operator/v1.7.0> <out dir>
#   TPUTORCH_KUBERAY_SOURCE=<out dir>/ray-operator TPUTORCH_CLUSTER_DIR=/tmp/kr17 hack/cluster.sh up
#
# <out dir>/ray-operator gets the tag's ray-operator tree (its CRDs under config/crd/bases, which
# hack/cluster.sh installs) and the binary `kuberay-operator`. Its Go dependencies come from the Go
# module proxy as every other build here. Nothing of it is committed.
set -euo pipefail
git_dir=$1 tag=$2 out=$3
mkdir -p "$out"
git -C "$git_dir" archive "$tag" ray-operator | tar -x -C "$out"
cd "$out/ray-operator"
go build -trimpath -ldflags "-s -w" -o kuberay-operator .
echo "$tag" > kuberay-operator.version
echo "$out/ray-operator"
