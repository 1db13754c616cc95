# syntax=docker/dockerfile:1
# The one image of every gpumeter component (the chart runs `gpumeter <command>` in it):
#
#   make image            # docker build -t gpumeter:<version> .
#
# Stage 1 compiles the worker's native rating extension (native/, Rust through pyo3 and maturin,
# the toolchain native/rust-toolchain.toml pins) and builds wheels of gpumeter and every
# dependency; stage 2 is a slim runtime installing only those wheels, run as a non-root user
# and friendly to a read-only root filesystem (nothing is written outside /tmp at run time).
# `make dist` builds the same two gpumeter wheels on the host; tests/e2e/test_wheel.py checks
# what they hold, since no base image can be pulled where the tests run.
#
# NVML (libnvidia-ml.so.1) is not in the image: it belongs to the node's driver, and the NVIDIA
# container runtime mounts it (the chart's agent.gkeDriverFromHost mounts the host's on GKE).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
# rustup installs no toolchain here: native/rust-toolchain.toml names the one to build with.
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain none
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY native/ native/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./native
COPY pyproject.toml README.md ./
COPY gpumeter/ gpumeter/
COPY collectors/ collectors/
COPY streams/ streams/
COPY pricing/ pricing/
COPY quota/ quota/
COPY insights/ insights/
COPY scheduler_hooks/ scheduler_hooks/
COPY dashboards/ dashboards/
# gpumeter and every dependency as wheels: the runtime stage needs no compiler.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG UID=65532
RUN groupadd --gid ${UID} gpumeter && useradd --uid ${UID} --gid ${UID} --no-create-home \
    --home-dir /tmp --shell /usr/sbin/nologin gpumeter
COPY --from=build /wheels /wheels
# Installed, then the PodResources stubs generated beside their .proto while site-packages is
# still writable (every pod runs with a read-only root filesystem).
RUN pip install --no-cache-dir --no-index /wheels/*.whl \
    && rm -rf /wheels \
    && python -m collectors.agent.proto.generate \
    && python -c "from collectors.agent.proto.generate import load; load()" \
    && python -c "from streams.native_rating import BUILT; assert BUILT, 'gpumeter_native missing'"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache
# Non-root by default; the node agent's pod runs it as root for the kubelet's root-only socket.
USER ${UID}:${UID}
WORKDIR /tmp
ENTRYPOINT ["gpumeter"]
CMD ["--help"]
