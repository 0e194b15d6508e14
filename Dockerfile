# syntax=docker/dockerfile:1.7
# One image for the three agents (dra-discovery, dra-allocation, dra-health), dra-nats-auth and
# dractl. No ENTRYPOINT: each DaemonSet / compose service names its command.
#   docker build -t ghcr.io/dra-suite/dra-suite:0.1.0 .
# Every dependency at the version of constraints.txt (the versions CI tests with). The
# production image (the default target) has no extra and no dev cluster; the compose stack
# builds the `devcluster` target with EXTRAS=devcluster for the API emulator and the load
# generator (docs/install.md, "The image").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the project wheel and the wheels of all its dependencies ---------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY shared ./shared
COPY services ./services
RUN python -m pip wheel --wheel-dir /wheels --constraint constraints.txt ".${EXTRAS:+[$EXTRAS]}"

# --- runtime: a venv installed offline from those wheels ---------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG EXTRAS=""
LABEL org.opencontainers.image.title="dra-suite" \
      org.opencontainers.image.description="Kubernetes DRA driver for AI accelerators (NVIDIA, Ascend, sim)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/dra-suite \
    PATH=/opt/dra-suite/bin:$PATH
# pip compiles the .pyc files at install time, so read-only root filesystems lose nothing.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv "$VIRTUAL_ENV" \
 && "$VIRTUAL_ENV/bin/pip" install --no-index --find-links /wheels "dra-suite${EXTRAS:+[$EXTRAS]}" \
 && groupadd --system --gid 10001 dra \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin dra
# Non-root by default (discovery, health, dractl, the emulator). The allocation agent
# overrides this with uid 0: the kubelet's plugin directories on the host are root-owned.
USER 10001:10001
WORKDIR /
CMD ["dractl", "--help"]

# --- devcluster: the runtime plus the dev cluster (the compose stack only) -----------------
# The dev cluster is not part of the wheel; it comes in as source, beside the venv.
FROM runtime AS devcluster
COPY devcluster /opt/dra-suite-devcluster/devcluster
ENV PYTHONPATH=/opt/dra-suite-devcluster

# --- production: the default target, the runtime as is ----------------------------------
FROM runtime AS production
