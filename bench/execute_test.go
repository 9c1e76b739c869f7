package bench

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// BenchmarkExecuteTool times ExecuteTool echo end to end through gRPC, on
// each store, against the baselines measured alongside it on the same
// server and connection (health Check; on Postgres also one INSERT commit):
//
//   - new-key: a fresh idempotency key per call, the full hot path
//     (claim, which reads the key, execute, record).
//   - replay: the same, already succeeded key every call (the claim that
//     finds it held and the deduped audit event).
//
// and each of them serially and under RunParallel. Read the x-health and
// x-insert metrics (see report); ns/op is the call's own latency.
func BenchmarkExecuteTool(b *testing.B) {
	for _, backend := range apptest.Backends() {
		b.Run(backend, func(b *testing.B) {
			s := startServer(b, backend)
			b.Run("new-key", func(b *testing.B) {
				measureSerial(b, s.opExecute, s.baselines()...)
			})
			b.Run("new-key-parallel", func(b *testing.B) {
				measureParallel(b, s.opExecute, s.baselines()...)
			})
			b.Run("replay", func(b *testing.B) {
				measureSerial(b, s.opReplay(b), s.baselines()...)
			})
			b.Run("replay-parallel", func(b *testing.B) {
				measureParallel(b, s.opReplay(b), s.baselines()...)
			})
		})
	}
}

// BenchmarkPostgresStatements times the shapes of the statements the
// Postgres store runs on the hot path, each against the single-row INSERT
// commit measured alongside it (x-insert), so that an ExecuteTool on
// Postgres can be read as a sum of them:
//
//   - read: one SELECT by key, autocommit (the idempotency lookup: one round
//     trip, no WAL flush).
//   - tx: BEGIN; INSERT; COMMIT (a deduped audit event: three round trips,
//     one commit).
//   - tx-batch: BEGIN; INSERT … RETURNING; a batch of one INSERT; COMMIT
//     (the reserve and the record: four round trips, one commit).
func BenchmarkPostgresStatements(b *testing.B) {
	s := startServer(b, apptest.Postgres)
	ctx := context.Background()
	var id int64
	if err := s.pool.QueryRow(ctx, `INSERT INTO bench_commit (note) VALUES ('read me') RETURNING id`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	read := func() op {
		return op{name: "read", do: func(ctx context.Context) error {
			var note string
			return s.pool.QueryRow(ctx, `SELECT note FROM bench_commit WHERE id = $1`, id).Scan(&note)
		}}
	}
	tx := func() op {
		return op{name: "tx", do: func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO bench_commit (note) VALUES ($1)`, "tx")
				return err
			})
		}}
	}
	txBatch := func() op {
		return op{name: "tx-batch", do: func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				var first, second int64
				if err := tx.QueryRow(ctx, `INSERT INTO bench_commit (note) VALUES ($1) RETURNING id`, "claim").Scan(&first); err != nil {
					return err
				}
				var batch pgx.Batch
				batch.Queue(`INSERT INTO bench_commit (note) VALUES ($1) RETURNING id`, "event").
					QueryRow(func(row pgx.Row) error { return row.Scan(&second) })
				return tx.SendBatch(ctx, &batch).Close()
			})
		}}
	}
	for _, subject := range []func() op{read, tx, txBatch} {
		b.Run(subject().name, func(b *testing.B) {
			measureSerial(b, subject, s.opInsert)
		})
	}
}
