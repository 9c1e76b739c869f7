// Package bench measures what toolsvc's call pipeline costs, as ratios
// against a baseline measured in the same process, on the same server and
// connection, interleaved with the measured calls: a grpc.health.v1 Check
// (the cost of a gRPC round trip through the server's interceptors) and, on
// Postgres, one single-row INSERT commit on the same database (the cost of a
// commit). It also pins the storage budget of docs/pipeline.md#storage-budget per call — at most two
// commits per executed call, one per replay (its claim, with its audit
// event) — in a test that runs with the ordinary `go test ./...`.
//
// The package has no non-test code: the benchmarks are in its _test.go
// files and run with
//
//	go test -run='^$' -bench=. -benchtime=1s -count=10 ./bench/
//
// The load command cmd/toolsvc-load drives a running server the same way.
// BENCHMARKS.md has the commands, the results and what they mean.
package bench
