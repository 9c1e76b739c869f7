package pgtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

func dbName(t *testing.T, dbURL string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("parse %s: %v", dbURL, err)
	}
	return cfg.Database
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&ok); err != nil {
		t.Fatalf("query: %v", err)
	}
	return ok
}

// Each test gets its own migrated database, independent of the others, and
// it is gone when the test ends.
func TestNewDatabase(t *testing.T) {
	var names []string
	for i := range 2 {
		t.Run("db", func(t *testing.T) {
			dbURL := pgtest.NewDatabase(t)
			names = append(names, dbName(t, dbURL))
			pool := pgtest.NewPool(t, dbURL)
			if err := postgres.CheckSchema(t.Context(), pool); err != nil {
				t.Fatalf("clone is not at the latest schema: %v", err)
			}
			var n int
			if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM tools").Scan(&n); err != nil || n != 0 {
				t.Fatalf("clone %d has %d tools (%v), want an empty store", i, n, err)
			}
			// Write something: the next clone must not see it.
			if _, err := pool.Exec(t.Context(), `INSERT INTO tools (name, version, source, definition, created_at, updated_at, incarnation)
				VALUES ('leak', 1, 'api', '{}', now(), now(), 'inc-leak')`); err != nil {
				t.Fatalf("insert: %v", err)
			}
		})
	}
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("database names %v are not distinct", names)
	}
	for _, n := range names {
		if databaseExists(t, n) {
			t.Fatalf("database %s still exists after its test", n)
		}
	}
}

func TestNewEmptyDatabase(t *testing.T) {
	pool := pgtest.NewPool(t, pgtest.NewEmptyDatabase(t))
	st, err := postgres.Status(t.Context(), pool)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	for _, m := range st {
		if m.Applied {
			t.Fatalf("empty database has migration %d applied", m.Version)
		}
	}
}

// helperEnv marks the child process of TestUnreachableServer.
const helperEnv = "PGTEST_HELPER_UNREACHABLE"

// TestHelperUnreachable only does something inside TestUnreachableServer's
// child process, where the server URL points at a closed port.
func TestHelperUnreachable(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper for TestUnreachableServer")
	}
	pgtest.NewDatabase(t)
	t.Fatal("NewDatabase returned for an unreachable server")
}

// An unreachable server never passes silently: without CI the test is
// skipped with instructions, with CI it fails.
func TestUnreachableServer(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		wantFail bool
		wantText string
	}{
		{ci: "", wantFail: false, wantText: "--- SKIP: TestHelperUnreachable"},
		{ci: "true", wantFail: true, wantText: "--- FAIL: TestHelperUnreachable"},
	} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperUnreachable$", "-test.v")
		cmd.Env = append(os.Environ(),
			helperEnv+"=1",
			pgtest.EnvURL+"=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2",
			"CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail {
			t.Fatalf("CI=%q: child failed = %v (%v), want %v:\n%s", tc.ci, failed, err, tc.wantFail, out)
		}
		for _, want := range []string{tc.wantText, "pg_ctlcluster --skip-systemctl-redirect 15 main start", pgtest.EnvURL} {
			if !strings.Contains(string(out), want) {
				t.Fatalf("CI=%q: output lacks %q:\n%s", tc.ci, want, out)
			}
		}
	}
}
