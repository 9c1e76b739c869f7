package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/store/postgres/synthtrail"
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
// over the 10 days before today (synthtrail.Fill), to measure what a large
// trail changes on the hot path.
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
		t, err := synthtrail.Fill(ctx, pool, n, 10)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("audit trail: %d events over %d days (partitioned: %v) in %s", t.Events, t.Days, t.Partitioned, t.Took.Round(time.Millisecond))
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
	so := newStoreOps(st, "cpu")
	ops := []struct {
		name string
		do   func() error
	}{
		{"reserve+record", func() error { return so.reserveRecord(ctx) }},
		{"append", func() error { return so.appendEvent(ctx) }},
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
