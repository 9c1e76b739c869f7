package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// partitionOf is the partition that holds the event with id.
func partitionOf(t *testing.T, pool *pgxpool.Pool, id string) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(t.Context(), `SELECT tableoid::regclass::text FROM audit_events WHERE id = $1`, id).Scan(&name); err != nil {
		t.Fatalf("partition of %s: %v", id, err)
	}
	return name
}

func scalar[T any](t *testing.T, pool *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := pool.QueryRow(t.Context(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// TestAuditPartitions: events of a day without a partition wait in the
// default one; creating the day's partition moves them into it without
// queueing their notifications again; retention drops a past day's
// partition whole, and the rest of the trail stays.
func TestAuditPartitions(t *testing.T) {
	t.Parallel()
	st := pgtest.NewStore(t)
	pool := st.Pool()
	ctx := t.Context()
	// Days far from today: no partition exists for them yet.
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 40)
	ev := func(typ string, at time.Time) store.AuditEvent {
		return audit.New(typ, store.AuditEvent{Time: at, CallID: audit.NewID(), Principal: "p", Tool: "echo"})
	}
	outbox := func() int {
		return scalar[int](t, pool, `SELECT count(*) FROM notification_outbox`)
	}

	early := ev(audit.GateRequired, day.Add(time.Hour))
	batch := []store.AuditEvent{early}
	if err := st.AppendAuditEvents(ctx, batch); err != nil {
		t.Fatal(err)
	}
	early = batch[0] // with its Seq
	if got := partitionOf(t, pool, early.ID); got != "audit_events_default" {
		t.Fatalf("event of a day without partition in %s", got)
	}
	if n := outbox(); n != 1 {
		t.Fatalf("outbox holds %d, want 1", n)
	}

	created, err := st.MaintainAuditPartitions(ctx, day)
	if err != nil || created != 3 {
		t.Fatalf("MaintainAuditPartitions = %d, %v; want 3 partitions", created, err)
	}
	if again, err := st.MaintainAuditPartitions(ctx, day); err != nil || again != 0 {
		t.Fatalf("MaintainAuditPartitions again = %d, %v; want 0", again, err)
	}
	want := "audit_events_p" + day.Format("20060102")
	if got := partitionOf(t, pool, early.ID); got != want {
		t.Fatalf("event moved to %s, want %s", got, want)
	}
	if n := outbox(); n != 1 {
		t.Fatalf("moving an event queued its notification again: outbox holds %d", n)
	}

	same := ev(audit.GateRequired, day.Add(2*time.Hour))
	next := ev(audit.ToolCallSucceeded, day.AddDate(0, 0, 1).Add(time.Hour))
	if err := st.AppendAuditEvents(ctx, []store.AuditEvent{same, next}); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, pool, same.ID); got != want {
		t.Fatalf("event of a partitioned day in %s", got)
	}
	if n := outbox(); n != 2 {
		t.Fatalf("outbox holds %d, want 2: the trigger works on a partition", n)
	}
	// The same event again (a retried append) is a conflict.
	if err := st.AppendAuditEvents(ctx, []store.AuditEvent{same}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("append of a stored event = %v, want ErrConflict", err)
	}
	evs, err := st.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d events in the trail, want 3", len(evs))
	}
	if evs[0].ID != early.ID || evs[0].Seq != early.Seq || evs[1].ID != same.ID || evs[2].ID != next.ID {
		t.Fatalf("trail = %s/%d %s %s, want %s/%d %s %s", evs[0].ID, evs[0].Seq, evs[1].ID, evs[2].ID, early.ID, early.Seq, same.ID, next.ID)
	}

	// Retention up to the end of the day drops its partition whole, even
	// past the limit.
	n, err := st.DeleteAuditEventsBefore(ctx, day.AddDate(0, 0, 1), 1)
	if err != nil || n != 2 {
		t.Fatalf("DeleteAuditEventsBefore = %d, %v; want the day's 2 events", n, err)
	}
	if exists := scalar[bool](t, pool, `SELECT to_regclass($1) IS NOT NULL`, want); exists {
		t.Fatalf("partition %s still exists", want)
	}
	evs, err = st.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(evs) != 1 || evs[0].ID != next.ID {
		t.Fatalf("trail after retention = %+v, %v", evs, err)
	}
}

// TestAuditPartitionsUpgrade: migration 0011 turns an existing trail into a
// partitioned one, every event kept with its seq, and new events follow.
func TestAuditPartitionsUpgrade(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, pgtest.NewEmptyDatabase(t))
	ctx := context.Background()
	if _, err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.MigrateDown(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO audit_events (id, time, type, call_id, principal, tool)
		SELECT 'old-' || g, now() - g * interval '5 hours', 'tool_call.succeeded', 'c' || g, 'p', 'echo'
		FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}
	before := scalar[string](t, pool, `SELECT string_agg(seq || ':' || id || ':' || time, ',' ORDER BY seq) FROM audit_events`)
	if _, err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if kind := scalar[string](t, pool, `SELECT relkind::text FROM pg_class WHERE oid = 'audit_events'::regclass`); kind != "p" {
		t.Fatalf("audit_events is of kind %s after the upgrade", kind)
	}
	after := scalar[string](t, pool, `SELECT string_agg(seq || ':' || id || ':' || time, ',' ORDER BY seq) FROM audit_events`)
	if after != before {
		t.Fatalf("events changed by the upgrade:\n%s\n%s", before, after)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM audit_events_default`); n != 0 {
		t.Fatalf("%d old events in the default partition, want each in its day's", n)
	}
	seq := scalar[int64](t, pool, `INSERT INTO audit_events (id, time, type) VALUES ('new', now(), 'tool_call.succeeded') RETURNING seq`)
	if top := scalar[int64](t, pool, `SELECT max(seq) FROM audit_events WHERE id <> 'new'`); seq <= top {
		t.Fatalf("new event's seq %d not after the old ones' %d", seq, top)
	}
	// And back: the same trail in one table again.
	if _, err := postgres.MigrateDown(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	if kind := scalar[string](t, pool, `SELECT relkind::text FROM pg_class WHERE oid = 'audit_events'::regclass`); kind != "r" {
		t.Fatalf("audit_events is of kind %s after the down migration", kind)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM audit_events`); n != 51 {
		t.Fatalf("%d events after the down migration, want 51", n)
	}
}

// Retention of an analyzed day reports the events the database's
// statistics estimate it held, and does not count them (reading a day of
// millions of events would slow the calls going on): rows removed behind
// the statistics' back still count.
func TestAuditRetentionDoesNotCountAnalyzedDays(t *testing.T) {
	t.Parallel()
	st := pgtest.NewStore(t)
	pool := st.Pool()
	ctx := t.Context()
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -20)
	name := "audit_events_p" + day.Format("20060102")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+name+` PARTITION OF audit_events FOR VALUES FROM ('`+
		day.Format(time.RFC3339)+`') TO ('`+day.AddDate(0, 0, 1).Format(time.RFC3339)+`')`); err != nil {
		t.Fatal(err)
	}
	events := make([]store.AuditEvent, 400)
	for i := range events {
		events[i] = audit.New(audit.ToolCallSucceeded, store.AuditEvent{
			Time: day.Add(time.Duration(i) * time.Minute), CallID: audit.NewID(), Principal: "p", Tool: "echo"})
	}
	if err := st.AppendAuditEvents(ctx, events); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+name); err != nil {
		t.Fatal(err)
	}
	// Half of the day goes without the statistics knowing.
	if _, err := pool.Exec(ctx, `DELETE FROM `+name+` WHERE time < $1`, day.Add(200*time.Minute)); err != nil {
		t.Fatal(err)
	}
	n, err := st.DeleteAuditEventsBefore(ctx, day.AddDate(0, 0, 1), 0)
	if err != nil || n != len(events) {
		t.Fatalf("DeleteAuditEventsBefore = %d, %v; want the analyzed estimate, %d", n, err, len(events))
	}
	if exists := scalar[bool](t, pool, `SELECT to_regclass($1) IS NOT NULL`, name); exists {
		t.Fatalf("partition %s still exists", name)
	}
}
