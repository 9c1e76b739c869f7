# syntax=docker/dockerfile:1
#
# A static toolsvc binary on a distroless base, running as non-root.
#   docker build --build-arg VERSION=$(git describe --always) -t toolsvc .
#
# Note: while authentication is not built, toolsvc refuses to listen on
# anything but loopback, so a container can run `toolsvc migrate` but its
# server is only reachable from inside the container's network namespace
# (e.g. a sidecar in the same pod).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/toolsvc ./cmd/toolsvc

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/toolsvc /usr/local/bin/toolsvc
USER nonroot:nonroot
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/toolsvc"]
CMD ["serve"]
