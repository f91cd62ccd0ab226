# tputorch-operator image: `docker build -t IMAGE .` at the repo root.
# Stage 1 builds the wheel; stage 2 installs it into a clean Python with no build tools.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# README.m[d]: the long description, optional (the wheel builds without it; setuptools warns).
COPY pyproject.toml README.m[d] ./
COPY operator/ operator/
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=builder /wheels /wheels
# Dependencies (kopf, kubernetes, pyyaml, jinja2) come from PyPI as wheels; pip, setuptools and
# wheel are then removed so the final image holds no build tooling.
RUN pip install /wheels/*.whl \
 && rm -rf /wheels \
 && pip uninstall -y pip setuptools wheel \
 && groupadd --gid 65532 tputorch \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tputorch
USER 65532:65532
# 8080: kopf liveness (/healthz), 9090: Prometheus metrics (/metrics), as the Helm chart sets them.
EXPOSE 8080 9090
ENTRYPOINT ["tputorch"]
CMD ["run", "--standalone"]
