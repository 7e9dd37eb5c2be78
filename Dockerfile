# One image for every component: the `composable-dra` CLI (see composable_dra_cli/__init__.py).
#   docker build -t composable-dra:0.1.0 .
#   docker run --rm composable-dra:0.1.0 --help
# Without a Docker engine, hack/image/build.sh builds this same file with buildah on a
# Debian bookworm python3 base that it makes itself (README: "The image").
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY composable_dra/ composable_dra/
COPY composable_dra_cli/ composable_dra_cli/
COPY composable_operator/ composable_operator/
COPY device_scaler/ device_scaler/
COPY dra_driver/ dra_driver/
COPY pool_publisher/ pool_publisher/
COPY fabric_emulator/ fabric_emulator/
COPY remote_gpu/ remote_gpu/
# Wheels of the package and of every dependency; the runtime stage installs only these.
RUN pip wheel --wheel-dir /wheels ".[nvml,remote]"

FROM ${PYTHON_IMAGE}
# VERSION follows pyproject.toml; hack/image/build.sh passes both (tests/e2e/test_image.py
# checks that the image carries these labels).
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="composable-dra" \
      org.opencontainers.image.description="Kubernetes DRA driver suite that attaches GPUs from a disaggregated pool" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/composable-dra/composable-dra" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "composable-dra[nvml,remote]" \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin composable
# Non-root by default; the kubelet plugin's DaemonSet runs it as root for the host paths.
USER 10001:10001
ENTRYPOINT ["composable-dra"]
CMD ["--help"]
