package postgres_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// schemaTables are the tables the migrations create.
var schemaTables = []string{"approvals", "audit_events", "calls", "console_sessions", "notification_deliveries",
	"notification_outbox", "previews", "signing_keys", "task_history", "tool_health", "tools", "toolsets", "used_tokens"}

func tablesOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	// Partitions (audit_events' days and default) are a table's storage,
	// not tables of their own.
	rows, err := pool.Query(t.Context(), `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
			AND c.relname <> 'toolsvc_schema_migrations' ORDER BY c.relname`)
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatalf("scan: %v", err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("list tables: %v", err)
	}
	return out
}

func latest(t *testing.T) int {
	t.Helper()
	v, err := postgres.LatestMigration()
	if err != nil || v < 1 {
		t.Fatalf("LatestMigration = %d, %v", v, err)
	}
	return v
}

// count is how many migrations the binary embeds.
func count(t *testing.T) int {
	t.Helper()
	n, err := postgres.KnownMigrationCount()
	if err != nil || n < 1 {
		t.Fatalf("KnownMigrationCount = %d, %v", n, err)
	}
	return n
}

func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, pgtest.NewEmptyDatabase(t))
	ctx := t.Context()
	want, last := count(t), latest(t)

	// Before: every known migration listed, none applied, schema behind.
	st, err := postgres.Status(ctx, pool)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if len(st) != want {
		t.Fatalf("Status lists %d migrations, want %d: %+v", len(st), want, st)
	}
	for _, m := range st {
		if m.Applied || m.Unknown || !m.AppliedAt.IsZero() {
			t.Fatalf("before migrating, %+v is applied", m)
		}
	}
	if st[0].Version != 1 || st[0].Name != "init" {
		t.Fatalf("first migration = %+v, want 0001 init", st[0])
	}
	err = postgres.CheckSchema(ctx, pool)
	if !errors.Is(err, postgres.ErrSchemaBehind) {
		t.Fatalf("CheckSchema on an empty database = %v, want ErrSchemaBehind", err)
	}
	for _, frag := range []string{"at version 0", "needs " + strconv.Itoa(last), "toolsvc migrate up", "--migrate"} {
		if !strings.Contains(err.Error(), frag) {
			t.Fatalf("CheckSchema error %q does not say %q", err, frag)
		}
	}

	// Up.
	applied, err := postgres.Migrate(ctx, pool)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if len(applied) != want || applied[0].Version != 1 || !applied[0].Applied || applied[0].AppliedAt.IsZero() {
		t.Fatalf("Migrate applied %+v, want all %d", applied, want)
	}
	if got := tablesOf(t, pool); strings.Join(got, ",") != strings.Join(schemaTables, ",") {
		t.Fatalf("tables after up = %v, want %v", got, schemaTables)
	}
	st, err = postgres.Status(ctx, pool)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	for _, m := range st {
		if !m.Applied || m.AppliedAt.IsZero() || m.Unknown {
			t.Fatalf("after migrating, %+v is not applied", m)
		}
	}
	if err := postgres.CheckSchema(ctx, pool); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
	again, err := postgres.Migrate(ctx, pool)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Migrate applied %+v, %v; want nothing", again, err)
	}

	// Down all the way.
	reverted, err := postgres.MigrateDown(ctx, pool, want)
	if err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	if len(reverted) != want || reverted[0].Version != last || reverted[0].Applied {
		t.Fatalf("MigrateDown reverted %+v", reverted)
	}
	if got := tablesOf(t, pool); len(got) != 0 {
		t.Fatalf("tables after down = %v, want none", got)
	}
	if err := postgres.CheckSchema(ctx, pool); !errors.Is(err, postgres.ErrSchemaBehind) {
		t.Fatalf("CheckSchema after down = %v, want ErrSchemaBehind", err)
	}
	none, err := postgres.MigrateDown(ctx, pool, 3)
	if err != nil || len(none) != 0 {
		t.Fatalf("MigrateDown with nothing applied = %+v, %v", none, err)
	}

	// And up again: the down migration really undid everything.
	if _, err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate after down: %v", err)
	}
	if got := tablesOf(t, pool); strings.Join(got, ",") != strings.Join(schemaTables, ",") {
		t.Fatalf("tables after up again = %v, want %v", got, schemaTables)
	}
	if err := postgres.CheckSchema(ctx, pool); err != nil {
		t.Fatalf("CheckSchema after up again: %v", err)
	}
}

func TestCheckSchemaAhead(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, pgtest.NewDatabase(t))
	ctx := t.Context()
	// A newer toolsvc applied a migration this one does not know.
	if _, err := pool.Exec(ctx, `INSERT INTO toolsvc_schema_migrations (version, name) VALUES (9999, 'from_the_future')`); err != nil {
		t.Fatalf("insert: %v", err)
	}
	err := postgres.CheckSchema(ctx, pool)
	if !errors.Is(err, postgres.ErrSchemaAhead) || errors.Is(err, postgres.ErrSchemaBehind) {
		t.Fatalf("CheckSchema = %v, want ErrSchemaAhead", err)
	}
	if !strings.Contains(err.Error(), "upgrade toolsvc") || !strings.Contains(err.Error(), "9999") {
		t.Fatalf("CheckSchema error %q does not say what to do", err)
	}
	st, err := postgres.Status(ctx, pool)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	last := st[len(st)-1]
	if last.Version != 9999 || !last.Unknown || !last.Applied || last.Name != "from_the_future" {
		t.Fatalf("Status does not report the unknown migration: %+v", st)
	}
	// Reverting it is not this binary's business, and nothing changes.
	if _, err := postgres.MigrateDown(ctx, pool, 1); !errors.Is(err, postgres.ErrSchemaAhead) {
		t.Fatalf("MigrateDown over an unknown migration = %v, want ErrSchemaAhead", err)
	}
	if got := tablesOf(t, pool); len(got) != len(schemaTables) {
		t.Fatalf("MigrateDown that failed changed the tables: %v", got)
	}
	// A pending known migration and an unknown one: ahead wins (upgrading is
	// the way out of both).
	if _, err := pool.Exec(ctx, `DELETE FROM toolsvc_schema_migrations WHERE version = 1`); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := postgres.CheckSchema(ctx, pool); !errors.Is(err, postgres.ErrSchemaAhead) {
		t.Fatalf("CheckSchema = %v, want ErrSchemaAhead", err)
	}
}

// Replicas starting together each run Migrate: every migration is applied
// exactly once and none of them fails.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDatabase(t)
	const replicas = 4
	pools := make([]*pgxpool.Pool, replicas)
	for i := range pools {
		pools[i] = pgtest.NewPool(t, dbURL)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied = map[int]int{}
		errs    []error
	)
	start := make(chan struct{})
	for _, pool := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			done, err := postgres.Migrate(t.Context(), pool)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, m := range done {
				applied[m.Version]++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Migrate failed: %v", errs)
	}
	want := count(t)
	if len(applied) != want {
		t.Fatalf("applied versions %v, want all %d", applied, want)
	}
	for v, n := range applied {
		if n != 1 {
			t.Fatalf("migration %d applied %d times", v, n)
		}
	}
	var rows int
	if err := pools[0].QueryRow(t.Context(), `SELECT count(*) FROM toolsvc_schema_migrations`).Scan(&rows); err != nil || rows != want {
		t.Fatalf("migrations table has %d rows (%v), want %d", rows, err, want)
	}
	if err := postgres.CheckSchema(t.Context(), pools[0]); err != nil {
		t.Fatalf("CheckSchema: %v", err)
	}
}
