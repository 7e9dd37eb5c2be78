# One image for every component: the `composable-dra` CLI (see composable_dra/cli.py).
#   docker build -t composable-dra:0.1.0 .
#   docker run --rm composable-dra:0.1.0 --help
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY composable_dra/ composable_dra/
COPY composable_operator/ composable_operator/
COPY device_scaler/ device_scaler/
COPY dra_driver/ dra_driver/
COPY pool_publisher/ pool_publisher/
COPY fabric_emulator/ fabric_emulator/
COPY remote_gpu/ remote_gpu/
# Wheels of the package and of every dependency; the runtime stage installs only these.
RUN pip wheel --wheel-dir /wheels ".[nvml,remote]"

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "composable-dra[nvml,remote]" \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin composable
# Non-root by default; the kubelet plugin's DaemonSet runs it as root for the host paths.
USER 10001:10001
ENTRYPOINT ["composable-dra"]
CMD ["--help"]
