package postgres_test

import (
	"testing"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// TestMigrationToolIncarnation: migration 0004 gives every existing tool an
// incarnation, and gives an existing approval or preview its tool's
// incarnation only if it was made after that tool was created: one made
// before belongs to an earlier tool of the same name (deregistered since)
// and gets none, so it can never run the tool that now has the name.
func TestMigrationToolIncarnation(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, pgtest.NewDatabase(t))
	ctx := t.Context()
	// Back to just before 0004, whatever migrations follow it.
	latest, err := postgres.LatestMigration()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.MigrateDown(ctx, pool, latest-3); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	// The schema as 0002 left it, with a tool recreated at 10:00.
	for _, sql := range []string{
		`INSERT INTO tools (name, version, source, definition, created_at, updated_at)
			VALUES ('files', 1, 'api', '{}', '2030-01-01 10:00Z', '2030-01-01 10:00Z'),
			       ('other', 3, 'file', '{}', '2030-01-01 08:00Z', '2030-01-01 11:00Z')`,
		`INSERT INTO calls (id, principal_id, idempotency_key, fingerprint, tool, action, state, created_at, updated_at)
			VALUES ('c-old', 'p', 'k1', 'f', 'files', 'a', 'AWAITING_APPROVAL', '2030-01-01 09:00Z', '2030-01-01 09:00Z'),
			       ('c-new', 'p', 'k2', 'f', 'files', 'a', 'AWAITING_APPROVAL', '2030-01-01 10:30Z', '2030-01-01 10:30Z'),
			       ('c-gone', 'p', 'k3', 'f', 'gone', 'a', 'AWAITING_APPROVAL', '2030-01-01 10:30Z', '2030-01-01 10:30Z'),
			       ('c-pv-old', 'p', 'k4', 'f', 'files', 'a', 'AWAITING_PREVIEW', '2030-01-01 09:00Z', '2030-01-01 09:00Z'),
			       ('c-pv-new', 'p', 'k5', 'f', 'other', 'a', 'AWAITING_PREVIEW', '2030-01-01 10:30Z', '2030-01-01 10:30Z')`,
		`INSERT INTO approvals (id, call_id, requester, tool, action, fingerprint, idempotency_key, state, created_at, expires_at)
			VALUES ('a-old', 'c-old', 'p', 'files', 'a', 'f', 'k1', 'APPROVED', '2030-01-01 09:00Z', '2030-01-01 12:00Z'),
			       ('a-new', 'c-new', 'p', 'files', 'a', 'f', 'k2', 'PENDING', '2030-01-01 10:30Z', '2030-01-01 12:00Z'),
			       ('a-gone', 'c-gone', 'p', 'gone', 'a', 'f', 'k3', 'PENDING', '2030-01-01 10:30Z', '2030-01-01 12:00Z')`,
		`INSERT INTO previews (token, call_id, principal_id, idempotency_key, fingerprint, tool, action, state, created_at, expires_at)
			VALUES ('p-old', 'c-pv-old', 'p', 'k4', 'f', 'files', 'a', 'PENDING', '2030-01-01 09:00Z', '2030-01-01 12:00Z'),
			       ('p-new', 'c-pv-new', 'p', 'k5', 'f', 'other', 'a', 'PENDING', '2030-01-01 10:30Z', '2030-01-01 12:00Z')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}

	incarnation := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT name, incarnation FROM tools`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, inc string
		if err := rows.Scan(&name, &inc); err != nil {
			t.Fatal(err)
		}
		incarnation[name] = inc
	}
	rows.Close()
	if len(incarnation["files"]) != 36 || len(incarnation["other"]) != 36 || incarnation["files"] == incarnation["other"] {
		t.Fatalf("incarnations %v", incarnation)
	}
	for _, c := range []struct{ sql, id, want string }{
		{`SELECT tool_incarnation FROM approvals WHERE id = $1`, "a-old", ""},
		{`SELECT tool_incarnation FROM approvals WHERE id = $1`, "a-new", incarnation["files"]},
		{`SELECT tool_incarnation FROM approvals WHERE id = $1`, "a-gone", ""},
		{`SELECT tool_incarnation FROM previews WHERE token = $1`, "p-old", ""},
		{`SELECT tool_incarnation FROM previews WHERE token = $1`, "p-new", incarnation["other"]},
	} {
		var got string
		if err := pool.QueryRow(ctx, c.sql, c.id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: tool incarnation %q, want %q", c.id, got, c.want)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO tools (name, version, source, definition, created_at, updated_at, incarnation)
		VALUES ('empty', 1, 'api', '{}', now(), now(), '')`); err == nil {
		t.Fatal("a tool without an incarnation was stored")
	}
}
