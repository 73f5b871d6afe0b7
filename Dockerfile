# fencegate: a static binary on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/fencegate ./cmd/fencegate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fencegate /usr/local/bin/fencegate
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/fencegate"]
CMD ["serve"]
