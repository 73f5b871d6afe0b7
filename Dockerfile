# fencegate: a static, stripped binary on a distroless base, as non-root.
#
#   docker build --build-arg VERSION=v1.0.0 --build-arg COMMIT="$(git rev-parse HEAD)" \
#     --build-arg DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -t fencegate .
#
# `fencegate version` shows the three build arguments (commit and date
# "unknown" when not given).
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION="" COMMIT="" DATE=""
# deploy/deploy_test.go runs this go build line with the same flags.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${DATE}" -o /out/fencegate ./cmd/fencegate
# The data directory, owned by the distroless nonroot user (65532), which
# has no shell to chown it later.
RUN mkdir /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fencegate /usr/local/bin/fencegate
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# The default store, file:fencegate.db, is relative to the working
# directory: /data/fencegate.db, on a volume so it outlives the container.
WORKDIR /data
VOLUME /data
EXPOSE 7070 8080
# Distroless has no shell or curl: the binary probes its own /readyz.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["/usr/local/bin/fencegate", "health"]
ENTRYPOINT ["/usr/local/bin/fencegate"]
CMD ["serve"]
