// Package deploy holds toolsvc's deployment files — compose/ (two replicas on
// one Postgres, for a machine with Docker) and kubernetes/ (kubectl apply
// -k) — and the tests that validate them offline in the ordinary `go test
// ./...`: every Kubernetes manifest decoded strictly into the Kubernetes API
// types (an unknown or misplaced field is an error) and checked for what a
// deployment needs (probes, resources, references that resolve), the compose
// file against the compose specification's schema, and the Dockerfile's base
// images pinned. docs/deployment.md explains them.
package deploy
