// Package synthtrail writes a synthetic audit trail into a toolsvc
// database, for measurements that need a large one: toolsvc-bench's
// --audit-trail and bench's TOOLSVC_BENCH_TRAIL.
package synthtrail

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a *pgx.Conn and a *pgxpool.Pool have in common here.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Trail is what Fill wrote.
type Trail struct {
	Events      int
	Days        int
	Partitioned bool // audit_events is partitioned by day (migration 0011)
	Took        time.Duration
	// NoCheckpoint is why the checkpoint after the fill was not taken (it
	// needs a superuser or pg_checkpoint), or nil.
	NoCheckpoint error
}

// Fill writes n events spread evenly over the days days before today,
// oldest first (so that time follows seq, as in a trail that grew by
// itself), by SQL (generate_series): three events per call (attempted,
// succeeded, and a replay's deduped), 1,000 principals, two tools, a trace
// id on every fourth call, details like the pipeline's. Where audit_events
// is partitioned by day, each past day gets its partition first, as a
// server running through those days would have created it. The trail is
// then vacuumed and analyzed, as autovacuum would have, and checkpointed,
// so that the fill's dirty pages are written now rather than during what
// is measured next.
func Fill(ctx context.Context, db DB, n, days int) (Trail, error) {
	t := Trail{Days: days}
	if days < 1 || n < days {
		return t, fmt.Errorf("audit trail: %d events over %d days: want at least one event a day", n, days)
	}
	start := time.Now()
	if err := db.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = 'audit_events'::regclass`).Scan(&t.Partitioned); err != nil {
		return t, fmt.Errorf("audit trail: %w", err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	perDay := n / days
	for d := days; d >= 1; d-- {
		from := today.AddDate(0, 0, -d)
		if t.Partitioned {
			q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS audit_events_p%s PARTITION OF audit_events FOR VALUES FROM ('%s') TO ('%s')`,
				from.Format("20060102"), from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339))
			if _, err := db.Exec(ctx, q); err != nil {
				return t, fmt.Errorf("audit trail: %w", err)
			}
		}
		if _, err := db.Exec(ctx, `INSERT INTO audit_events (id, time, type, call_id, trace_id, principal, tool, action, outcome, detail)
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
			return t, fmt.Errorf("audit trail: %w", err)
		}
		t.Events += perDay
	}
	if _, err := db.Exec(ctx, `VACUUM ANALYZE audit_events`); err != nil {
		return t, fmt.Errorf("audit trail: %w", err)
	}
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		t.NoCheckpoint = err
	}
	t.Took = time.Since(start)
	return t, nil
}
