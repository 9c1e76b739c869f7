package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
)

// fillTrail gives the benchmark database an audit trail of n events spread
// evenly over the days before today (oldest first, so that time follows
// seq as it does in a trail that grew by itself), written by SQL
// (generate_series), then vacuumed and analyzed as autovacuum would have,
// and checkpointed.
// Where audit_events is partitioned by day (migration 0011), each past day
// gets its partition first, as a server running through those days would
// have created it; otherwise (older schemas) the events go in the one table.
func fillTrail(ctx context.Context, dbURL string, n, days int, stderr io.Writer) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var partitioned bool
	if err := conn.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = 'audit_events'::regclass`).Scan(&partitioned); err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	start := time.Now()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	perDay := n / days
	for d := days; d >= 1; d-- {
		from := today.AddDate(0, 0, -d)
		if partitioned {
			name := "audit_events_p" + from.Format("20060102")
			q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF audit_events FOR VALUES FROM ('%s') TO ('%s')`,
				name, from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339))
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("audit trail: %w", err)
			}
		}
		// Three events per call (attempted, succeeded, and a replay's
		// deduped every other call), 1,000 principals, two tools, a trace
		// id on every fourth call; details like the pipeline's.
		if _, err := conn.Exec(ctx, `INSERT INTO audit_events (id, time, type, call_id, trace_id, principal, tool, action, outcome, detail)
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
			return fmt.Errorf("audit trail: %w", err)
		}
	}
	for _, q := range []string{`VACUUM ANALYZE audit_events`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("audit trail: %w", err)
		}
	}
	// A checkpoint, so that the fill's gigabytes of dirty pages are written
	// now rather than during the cells measured next. It needs a superuser
	// (or pg_checkpoint); without one the measurement may meet it.
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		fmt.Fprintf(stderr, "audit trail: no checkpoint after the fill (%v): the cells that follow may meet its writes\n", err)
	}
	var size string
	if err := conn.QueryRow(ctx, `SELECT pg_size_pretty(pg_database_size(current_database()))`).Scan(&size); err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	fmt.Fprintf(stderr, "audit trail: %d events over %d days (partitioned: %v) in %s; database %s\n",
		perDay*days, days, partitioned, time.Since(start).Round(time.Millisecond), size)
	return nil
}

// retentionCheck measures a cell of s at callers callers while the
// oldest day of the trail is removed by the store's retention
// (DeleteAuditEventsBefore up to the end of that day, no limit) once the
// window has begun, and reports how long the removal took and how many
// events it removed. rep numbers the cell's keys: one no other cell used.
func retentionCheck(ctx context.Context, d *driver, s subject, rep, callers, days int, dbURL string, stderr io.Writer) (cell, error) {
	st, err := postgres.Open(ctx, dbURL)
	if err != nil {
		return cell{}, fmt.Errorf("retention: %w", err)
	}
	defer st.Close()
	before := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -days+1)
	var (
		took    time.Duration
		removed int
		rerr    error
	)
	d.during = func() {
		start := time.Now()
		removed, rerr = st.DeleteAuditEventsBefore(ctx, before, 0)
		took = time.Since(start)
	}
	defer func() { d.during = nil }()
	c := d.measure(ctx, s, rep, callers)
	if rerr != nil {
		return c, fmt.Errorf("retention: %w", rerr)
	}
	fmt.Fprintf(stderr, "retention during %s at %d callers: %d events before %s removed in %s; cell %.0f calls/s, p50 %s, p99 %s, failed %d\n",
		s.name, callers, removed, before.Format(time.DateOnly), took.Round(time.Millisecond),
		c.CallsPerSec, fmtMicros(c.P50Micros), fmtMicros(c.P99Micros), c.Failed)
	return c, nil
}
