package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// BenchmarkPostgresDatabaseCPU measures what the hot path's writes cost the
// database itself: the CPU time of the one Postgres backend that serves a
// one-connection pool (from /proc/<pid>/schedstat, so Postgres must run on
// this machine), per operation, reported as db-µs/op, next to the same for
// the single-row INSERT commit floor (insert-db-µs/op) and their ratio
// (x-insert-db). Unlike latency, a backend's CPU time hardly moves with the
// machine's load or the disk's flush time, so it compares trees and schemas
// run at different moments.
//
// TOOLSVC_BENCH_TRAIL=N first gives the database an audit trail of N events
// over the 10 days before today (SQL generate_series; day partitions where
// the schema is partitioned), vacuumed and analyzed, to measure what a
// large trail changes on the hot path.
func BenchmarkPostgresDatabaseCPU(b *testing.B) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(b)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off" // as the store's own pool
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	st := postgres.New(pool)
	defer st.Close()
	if n, _ := strconv.Atoi(os.Getenv("TOOLSVC_BENCH_TRAIL")); n > 0 {
		fillTrail(b, pool, n, 10)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_commit (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	cpu := func() time.Duration {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			b.Skipf("Postgres's backend is not on this machine: %v", err)
		}
		ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(ns)
	}
	now := time.Now().UTC()
	var seq atomic.Uint64
	event := func(typ, callID string) []store.AuditEvent {
		return []store.AuditEvent{audit.NewDetail(typ, store.AuditEvent{
			Time: now, CallID: callID, Principal: principal, Tool: "echo", Action: "echo",
		}, map[string]any{"attempt": 1, "probe": false})}
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"reserve+record", func() error {
			c := &store.Call{
				ID: audit.NewID(), PrincipalID: principal, IdempotencyKey: fmt.Sprintf("cpu-%d", seq.Add(1)),
				Fingerprint: "fp", Tool: "echo", Action: "echo", State: store.CallInProgress, AttemptCount: 1,
				LeaseExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
			}
			if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(audit.ToolCallAttempted, c.ID)}); err != nil || !ok {
				return fmt.Errorf("ClaimCall: claimed %v, %v", ok, err)
			}
			_, err := st.FinishCall(ctx, store.FinishCallParams{
				CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "ok"},
				Now: now, ExpiresAt: now.Add(time.Hour), Events: event(audit.ToolCallSucceeded, c.ID),
			})
			return err
		}},
		{"append", func() error { return st.AppendAuditEvents(ctx, event(audit.ToolCallDeduped, "")) }},
	}
	insert := func() error {
		_, err := pool.Exec(ctx, `INSERT INTO bench_commit (note) VALUES ($1)`, "x")
		return err
	}
	// per runs do n times and returns the backend's CPU time per op.
	per := func(do func() error, n int) time.Duration {
		start := cpu()
		for range n {
			if err := do(); err != nil {
				b.Fatal(err)
			}
		}
		return (cpu() - start) / time.Duration(n)
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			per(op.do, 50) // prepares, caches
			per(insert, 50)
			// Alternate rounds of the subject and the floor.
			const round = 50
			var subj, floor time.Duration
			rounds := 0
			for done := 0; done < b.N; done += round {
				subj += per(op.do, round)
				floor += per(insert, round)
				rounds++
			}
			subj, floor = subj/time.Duration(rounds), floor/time.Duration(rounds)
			b.ReportMetric(float64(subj.Nanoseconds())/1e3, "db-µs/op")
			b.ReportMetric(float64(floor.Nanoseconds())/1e3, "insert-db-µs/op")
			b.ReportMetric(float64(subj)/float64(floor), "x-insert-db")
		})
	}
}

// fillTrail writes n audit events spread over the days days before today,
// oldest first (time follows seq, as in a trail that grew by itself), three
// per call, 1,000 principals, two tools, a trace id on every fourth call.
func fillTrail(b *testing.B, pool *pgxpool.Pool, n, days int) {
	ctx := context.Background()
	start := time.Now()
	var partitioned bool
	if err := pool.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = 'audit_events'::regclass`).Scan(&partitioned); err != nil {
		b.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	perDay := n / days
	for d := days; d >= 1; d-- {
		from := today.AddDate(0, 0, -d)
		if partitioned {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS audit_events_p%s PARTITION OF audit_events
				FOR VALUES FROM ('%s') TO ('%s')`, from.Format("20060102"), from.Format(time.RFC3339),
				from.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `INSERT INTO audit_events (id, time, type, call_id, trace_id, principal, tool, action, outcome, detail)
			SELECT 'trail-' || $1::int || '-' || g,
				$2::timestamptz + (g::float8 / $3) * interval '1 day',
				(ARRAY['tool_call.attempted', 'tool_call.succeeded', 'tool_call.deduped'])[g % 3 + 1],
				'call-' || $1::int || '-' || (g / 3),
				CASE WHEN (g / 3) % 4 = 0 THEN 'trace-' || $1::int || '-' || (g / 12) ELSE '' END,
				'principal-' || ((g / 3) % 1000),
				(ARRAY['echo', 'files'])[(g / 3) % 2 + 1], 'echo',
				CASE WHEN g % 3 = 1 THEN 'SUCCEEDED' ELSE '' END,
				'{"attempt":1,"latency_ms":3}'
			FROM generate_series(0, $3 - 1) g`, d, from, perDay); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE audit_events`); err != nil {
		b.Fatal(err)
	}
	b.Logf("audit trail: %d events over %d days (partitioned: %v) in %s", perDay*days, days, partitioned, time.Since(start).Round(time.Millisecond))
}
