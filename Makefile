# Two commands for a newcomer: `make demo` (the operator's main job on a local cluster) and
# `make test` (every test; CI runs exactly this through .ci/run).
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHON := $(abspath $(PY))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install binaries cluster-up cluster-down demo test unit bench crd docs-ref golden image example-images lock release

# pip's HTTP cache stores nothing here (the index's responses carry no caching headers), so the
# large wheels (torch with its CUDA libraries, Ray) are kept in a wheelhouse of our own that every
# clone reuses: `pip download` fetches only what it lacks (with the build backend the editable
# install needs), then the install reads the wheelhouse alone (pip prefers the index's copy of a
# file that both have).
WHEELS ?= $(or $(TPUTORCH_CACHE),$(HOME)/.cache/tputorch)/wheels
EXTRAS := test,train,serve,realray,torch,cli

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip download -q -d $(WHEELS) '.[$(EXTRAS)]' setuptools wheel
	rm -f $(WHEELS)/tputorch_operator-*
	$(PY) -m pip install -q --no-index --find-links $(WHEELS) -e '.[$(EXTRAS)]'
	hack/grafana-schema/install.sh >/dev/null
	touch $@

# The local cluster's binaries, helm, Kueue's controller (its own cache key: tests/cluster/test_kueue.py
# runs it) and cyclonus (its own key: the stand-in dashboard's NetworkPolicy engine): built once into ~/.cache/tputorch, or waited for while another build holds the lock.
binaries:
	hack/build.sh

cluster-up: install
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down

# REAL_RAY=1: the job runs a real Ray Train job on a real local Ray head, and a TPUTorchService
# serves a tiny model with Ray Serve LLM + vLLM on CPU and answers a completion (hack/demo_real_ray.py).
demo: install
	REAL_RAY=$(REAL_RAY) hack/demo.sh

# The operator image: dist/tputorch-operator.oci.tar and .docker.tar (hack/image.sh: docker when a
# daemon answers, else buildah; BASE_IMAGE=... picks the base). Reused while its sources are unchanged.
image:
	hack/image.sh build

# The release's artifacts in dist/ (hack/release.py): the packaged chart, the image as an OCI archive, the
# CRD bundle, the wheel and the sdist; refused when the package, the chart, the image tag and CHANGELOG.md
# disagree on the version. BASE_IMAGE=<image>@sha256:<digest> is the base to publish on; without it (and
# without docker) the image stands on the local stand-in base, which the output and dist/ say plainly.
release: install
	BASE_IMAGE=$(BASE_IMAGE) $(PY) hack/release.py build

# The images the docs build besides the operator's, with buildah on a stand-in of Ray's image
# (hack/README.md "The example images"); tests/image/test_example_images.py builds them in make test.
example-images:
	BUILDER=buildah hack/image.sh example examples/Dockerfile . tputorch-examples
	BUILDER=buildah hack/image.sh example examples/serve/Dockerfile examples/serve tputorch-examples-serve
	BUILDER=buildah hack/image.sh example examples/rl/Dockerfile . tputorch-examples-rl
	BUILDER=buildah hack/image.sh example examples/rl/tpu/Dockerfile . tputorch-examples-rl-tpu

# Every test: unit, integration (packaging), image, Ray and cluster; the cluster tests bring the local
# cluster up (and down) themselves. Nothing else needs to run before it on a fresh clone.
# hack/test.sh runs tests/cluster and the rest side by side (the rest at a lower CPU priority, its
# output after the cluster's), each with temp locations of its own, as a new machine has them (issue
# 31): Ray's default temp dir (RAY_TMPDIR), pytest's base temp and every cache a test fills under the
# temp root (TMPDIR: torch's inductor header, vLLM's dist dirs, helm's); removed after the run. So a
# used machine (CI's) cannot pass through what an earlier run left in /tmp. KEEP_TMP=1 keeps it for
# a post-mortem.
RUN_TMP_ROOT ?= /tmp
export RUN_TMP_ROOT KEEP_TMP
test: install binaries image
	hack/test.sh

unit: install
	$(PY) -m pytest tests/unit

# Benchmarks (bench/run.py --help for a quick run): tables, bench/out/results.json and a plot.
bench: install $(VENV)/.bench
	$(PY) bench/run.py $(BENCH_ARGS)
$(VENV)/.bench: pyproject.toml
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

# The operator image's Python dependencies, pinned with their hashes (the Dockerfile installs them
# with --require-hashes). Run after changing [project] dependencies in pyproject.toml.
lock:
	python3 -m venv .cache/pip-tools && .cache/pip-tools/bin/pip install -q pip-tools
	env -u PIP_FIND_LINKS .cache/pip-tools/bin/pip-compile -q --generate-hashes --strip-extras --no-emit-index-url \
	  --no-emit-find-links --allow-unsafe -o requirements.lock pyproject.toml

crd: install
	$(PY) -m tputorch crd --kind TPUTorchJob > crds/tputorch.io_tputorchjobs.yaml
	$(PY) -m tputorch crd --kind TPUTorchService > crds/tputorch.io_tputorchservices.yaml
	cp crds/tputorch.io_tputorchjobs.yaml crds/tputorch.io_tputorchservices.yaml charts/tputorch-operator/crds/

# docs/reference/: the CRD fields, the CLI, the Helm values, the metrics, the phases and conditions, the
# slices and the tested versions, generated from the code and build files (run after changing any of
# them, `make crd` included); tests/unit/test_docs_reference.py fails while a page is stale.
docs-ref: install
	$(PY) hack/gen_reference.py

golden: install
	UPDATE_GOLDEN=1 $(PY) -m pytest tests/unit/render/test_render.py
