# toolsvc developer targets. `make test` runs exactly the README's test
# command; `make ci` runs what CI runs.

GO ?= go

.PHONY: all generate build test lint run ci

all: build

## generate: regenerate gen/ from proto/ (buf and the protoc plugins are pinned in go.mod)
generate:
	$(GO) tool buf generate

## build: compile every package and the toolsvc binary into bin/
build:
	$(GO) build ./...
	$(GO) build -o bin/toolsvc ./cmd/toolsvc

## test: the README's test command (Postgres tests need a server at 127.0.0.1:5432)
test:
	$(GO) test -race -count=1 ./...

## lint: proto lint, go vet and golangci-lint (pinned in .ci/golangci-lint, configured in .golangci.yml)
lint:
	$(GO) tool buf lint
	$(GO) vet ./...
	./.ci/golangci-lint run ./...

## run: the server with the in-memory store and the demo tools on 127.0.0.1:50051
run:
	$(GO) run ./cmd/toolsvc serve

## ci: everything CI checks
ci:
	./.ci/run

## bench: the benchmarks, as ratios against baselines measured in the same run (BENCHMARKS.md)
.PHONY: bench
bench:
	$(GO) test -run='^$$' -bench=. -benchtime=1s -count=10 ./bench/
