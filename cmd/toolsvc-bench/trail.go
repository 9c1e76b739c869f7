package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/synthtrail"
)

// fillTrail gives the benchmark database an audit trail of n events spread
// evenly over the days before today (synthtrail.Fill), and reports it and
// the database's size on stderr.
func fillTrail(ctx context.Context, dbURL string, n, days int, stderr io.Writer) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t, err := synthtrail.Fill(ctx, conn, n, days)
	if err != nil {
		return err
	}
	if t.NoCheckpoint != nil {
		fmt.Fprintf(stderr, "audit trail: no checkpoint after the fill (%v): the cells that follow may meet its writes\n", t.NoCheckpoint)
	}
	var size string
	if err := conn.QueryRow(ctx, `SELECT pg_size_pretty(pg_database_size(current_database()))`).Scan(&size); err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	fmt.Fprintf(stderr, "audit trail: %d events over %d days (partitioned: %v) in %s; database %s\n",
		t.Events, t.Days, t.Partitioned, t.Took.Round(time.Millisecond), size)
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
