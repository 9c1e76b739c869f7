// Package migrations holds toolsvc's Postgres schema as numbered SQL files
// (NNNN_name.up.sql / NNNN_name.down.sql), embedded in the binary so that
// `toolsvc migrate` and `serve --migrate` need nothing from the filesystem.
// The runner that applies them lives in internal/store/postgres.
package migrations

import "embed"

// FS holds every migration file at its root.
//
//go:embed *.sql
var FS embed.FS
