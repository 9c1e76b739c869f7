# syntax=docker/dockerfile:1
#
# A static toolsvc binary on an empty base, running as a non-root user.
#   docker build --build-arg VERSION=$(git describe --always) -t toolsvc:dev .
#
# Base images are pinned by exact tag (the build stage) or are empty
# (scratch). To pin by digest as well, resolve the tag once with a registry
# at hand and append it: FROM golang:1.26.8-trixie@sha256:<digest>.
# deploy/dockerfile_test.go refuses a FROM line that is neither.
#
# The image holds the binary and the system CA bundle (for TLS to Postgres
# and to an OTLP collector), nothing else: no shell. Probes use toolsvc's own
# endpoints (grpc.health.v1 on metrics.listen; see docs/deployment.md).

FROM golang:1.26.8-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/toolsvc/toolsvc/internal/cli.version=${VERSION}" -o /out/toolsvc ./cmd/toolsvc

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/toolsvc /usr/local/bin/toolsvc
# 65532: the conventional "nonroot" id; the image has no /etc/passwd.
USER 65532:65532
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/toolsvc"]
CMD ["serve"]
