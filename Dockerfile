# syntax=docker/dockerfile:1
# Multi-stage build of the gateway and worker binaries.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gateway -p worker \
 && mkdir -p /out \
 && cp target/release/gateway target/release/worker /out/

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home model-runtime
COPY --from=build /out/gateway /out/worker /usr/local/bin/
USER model-runtime
ENV MODEL_RUNTIME_HOST=0.0.0.0 \
    MODEL_RUNTIME_PORT=4320 \
    MODEL_RUNTIME_LOG_FORMAT=json
EXPOSE 4320
# Embedded mode by default; docker-compose.yml runs the distributed layout.
CMD ["gateway"]
