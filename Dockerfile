# The kvgate image: one static binary (kvgate serve, sim, bench, ...).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /kvgate ./cmd/kvgate

FROM gcr.io/distroless/static:nonroot
COPY --from=build /kvgate /kvgate
USER 65532:65532
ENTRYPOINT ["/kvgate"]
