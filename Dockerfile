# tputorch-operator image: `make image` (docker, or buildah without a daemon), or by hand
# `docker build -t IMAGE .` at the repo root (BuildKit, the default since Docker 23).
# Stage 1 builds the wheel; stage 2 installs it into a clean Python with no build tools.
# The base is pinned by digest: a tag can be pushed again, a digest cannot. The digest is that of the
# tag's last push (3.11.11 was superseded by 3.11.12, so the tag no longer moves), as five unrelated
# public Dockerfiles pin it; no registry is reachable from the machine this was written on, so check
# it once with `crane digest python:3.11.11-slim-bookworm` (or `docker buildx imagetools inspect`)
# before a release build. Another base: --build-arg PYTHON_IMAGE=<image>@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# README.m[d]: the long description, optional (the wheel builds without it; setuptools warns).
COPY pyproject.toml requirements.lock README.m[d] ./
COPY operator/ operator/
# Secret pip-ca (optional): a CA bundle the build host needs to reach the package index, e.g.
# --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt. A secret mount is there for this RUN
# only and is never written to a layer.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Dependencies (kopf, kubernetes, pyyaml, jinja2 and theirs) come from PyPI at the versions and
# hashes of requirements.lock (pip-compile --generate-hashes; `make lock` regenerates it), then the
# operator's wheel without dependencies; pip, setuptools and wheel are then removed so the final
# image holds no build tooling. The wheel is bind-mounted from the builder stage, so it never becomes
# a layer of this image. kubernetes.aio, the client's asyncio
# twin and the largest part of the package, is never imported (the operator uses the sync client;
# kopf talks to the API with aiohttp itself): removed.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,from=builder,source=/src/requirements.lock,target=/requirements.lock \
    --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && pip install --require-hashes --only-binary=:all: -r /requirements.lock \
 && pip install --no-deps /wheels/*.whl \
 && pip uninstall -y pip setuptools wheel \
 && rm -rf "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubernetes/aio" \
 && groupadd --gid 65532 tputorch \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tputorch
USER 65532:65532
# 8080: kopf liveness (/healthz), 9090: Prometheus metrics (/metrics), as the Helm chart sets them.
EXPOSE 8080 9090
ENTRYPOINT ["tputorch"]
# One replica, every namespace; the chart passes its own args (leader election, namespaces, ports).
CMD ["run"]
