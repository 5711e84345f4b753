# payonce: the service (`payonce`), the bank its payouts go to (`payonce-bank`) and the
# load test (`loadtest`) in one small image.
# Built by docker-compose.yml; the migrations are compiled into the binary.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p api -p bank -p loadtest --features api/all-locks,api/otlp

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/payonce /usr/local/bin/payonce
COPY --from=build /src/target/release/payonce-bank /usr/local/bin/payonce-bank
COPY --from=build /src/target/release/loadtest /usr/local/bin/loadtest
# The bank's store directory exists in the image, owned by the user, so the named volume
# mounted there starts writable.
RUN useradd --system --create-home --home-dir /var/lib/payonce payonce \
 && install -d -o payonce -g payonce /var/lib/payonce/bank
USER payonce
WORKDIR /var/lib/payonce
ENV PAYONCE_ADDR=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["payonce"]
