# Multi-stage build of the `fabric` binary; the runtime image is Debian slim, non-root.
#   docker build -t fabric-runtime .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY runtime ./runtime
# Cargo reads every workspace member's manifest, even to build one binary: the benchmark driver
# and the Python package are copied for that only. The image ships `fabric` alone (`fabric bench`
# there says that `fabric-bench` is not installed: benchmarks run from a checkout).
COPY bench ./bench
COPY python/Cargo.toml ./python/Cargo.toml
COPY python/src ./python/src
RUN cargo build --release --locked --bin fabric

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /srv/fabric --create-home fabric
COPY --from=build /src/target/release/fabric /usr/local/bin/fabric
# The catalogue, packs and stub scripts are baked in; mount over /srv/fabric/routes (and the
# others) to serve another catalogue without rebuilding.
COPY routes /srv/fabric/routes
COPY prompt-packs /srv/fabric/prompt-packs
COPY stub /srv/fabric/stub
WORKDIR /srv/fabric
USER fabric
ENV FABRIC_DATABASE_URL=sqlite:///srv/fabric/data/fabric.db \
    FABRIC_LOG_FORMAT=json
RUN mkdir -p /srv/fabric/data
VOLUME ["/srv/fabric/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["fabric"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
