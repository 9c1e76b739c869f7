package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// planRows is how many calls (and audit events) the table grows to after
// its statistics were taken.
const planRows = 100_000

// TestPlansStayOnIndexes reproduces the plan trap of prepared statements:
// statistics taken while calls and audit_events were empty (analyzed, then
// autovacuum off, so they are never taken again), the hot-path statements
// prepared and planned generically then (plan_cache_mode forces the generic
// plan Postgres would settle on after a few executions), and the tables
// grown to planRows rows. On a connection of the store's pool each statement
// must still use its index; on a plain connection, the same steps give
// sequential scans, which shows that the test reproduces the trap.
func TestPlansStayOnIndexes(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pooled, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pooled.Release()
	plain, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)

	exec := func(conn *pgx.Conn, sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(plain, `ALTER TABLE calls SET (autovacuum_enabled = false)`)
	// audit_events is partitioned: the setting is each partition's.
	exec(plain, `DO $$ DECLARE p regclass; BEGIN
		FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'audit_events'::regclass LOOP
			EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', p);
		END LOOP; END $$`)
	exec(plain, `ANALYZE calls, audit_events`)

	stmts := postgres.HotStatements()
	conns := map[string]*pgx.Conn{"pool": pooled.Conn(), "plain": plain}
	explain := func(conn *pgx.Conn, s postgres.HotStatement) string {
		t.Helper()
		lits := make([]string, len(s.Args))
		for i, a := range s.Args {
			lits[i] = literal(t, a)
		}
		rows, err := conn.Query(ctx, `EXPLAIN EXECUTE "plan_`+s.Name+`"(`+strings.Join(lits, ", ")+`)`,
			pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("explain %s: %v", s.Name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("explain %s: %v", s.Name, err)
		}
		return strings.Join(lines, "\n")
	}
	for _, conn := range conns {
		exec(conn, `SET plan_cache_mode = force_generic_plan`)
		for _, s := range stmts {
			if _, err := conn.Prepare(ctx, "plan_"+s.Name, s.SQL); err != nil {
				t.Fatalf("prepare %s: %v", s.Name, err)
			}
			explain(conn, s) // the generic plan is made now, on empty tables
		}
	}

	start := time.Now()
	exec(plain, fmt.Sprintf(`INSERT INTO calls (id, principal_id, idempotency_key, fingerprint, tool, action, state,
			result, attempt_count, created_at, updated_at, expires_at)
		SELECT 'load-' || i, 'p' || (i %% 100), 'k' || i, 'fp', 'files', 'write', 'SUCCEEDED',
			'{"success":true}', 1, now(), now(), now() + interval '1 hour'
		FROM generate_series(1, %d) i`, planRows))
	exec(plain, fmt.Sprintf(`INSERT INTO audit_events (id, time, type, call_id, principal, tool, action)
		SELECT 'load-ev-' || i, now(), 'tool_call.succeeded', 'load-' || i, 'p' || (i %% 100), 'files', 'write'
		FROM generate_series(1, %d) i`, planRows))
	t.Logf("loaded %d calls and %d audit events in %s", planRows, planRows, time.Since(start).Round(time.Millisecond))

	trapped := 0
	for _, s := range stmts {
		for name, conn := range conns {
			plan := explain(conn, s)
			seq := strings.Contains(plan, "Seq Scan on calls") || strings.Contains(plan, "Seq Scan on audit_events")
			switch {
			case name == "pool" && seq:
				t.Errorf("%s on the store's connection scans a whole table:\n%s", s.Name, plan)
			case name == "pool" && !strings.Contains(plan, "Index"):
				t.Errorf("%s on the store's connection uses no index:\n%s", s.Name, plan)
			case name == "plain" && seq:
				trapped++
			}
		}
	}
	if trapped == 0 {
		t.Errorf("on a plain connection no statement kept a sequential scan: the test no longer reproduces the trap")
	}
	t.Logf("%d of %d statements kept a sequential-scan plan on a plain connection", trapped, len(stmts))

	// And the lookups stay fast on the store itself.
	start = time.Now()
	const lookups = 200
	for i := range lookups {
		if _, err := st.GetCallByKey(ctx, fmt.Sprintf("p%d", (i+1)%100), fmt.Sprintf("k%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("GetCallByKey on %d calls: %s per lookup", planRows, (time.Since(start) / lookups).Round(time.Microsecond))
}

// literal is a statement argument as an SQL literal of unknown type, which
// Postgres reads as the parameter's type.
func literal(t *testing.T, v any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	elem := func(s string) string {
		return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) + `"`
	}
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return quote(v)
	case int, int32, int64:
		return fmt.Sprint(v)
	case bool:
		return fmt.Sprint(v)
	case time.Time:
		return quote(v.Format(time.RFC3339Nano))
	case pgtype.Interval:
		return quote(fmt.Sprintf("%d microseconds", v.Microseconds))
	case []string:
		es := make([]string, len(v))
		for i, s := range v {
			es[i] = elem(s)
		}
		return quote("{" + strings.Join(es, ",") + "}")
	case []*string:
		es := make([]string, len(v))
		for i, s := range v {
			es[i] = "NULL"
			if s != nil {
				es[i] = elem(*s)
			}
		}
		return quote("{" + strings.Join(es, ",") + "}")
	case []time.Time:
		es := make([]string, len(v))
		for i, tm := range v {
			es[i] = elem(tm.Format(time.RFC3339Nano))
		}
		return quote("{" + strings.Join(es, ",") + "}")
	default:
		t.Fatalf("no literal for %T", v)
		return ""
	}
}
