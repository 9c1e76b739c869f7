// Package pgtest gives tests their own Postgres database, cheaply: the
// embedded migrations are applied once to a template database (named after
// a hash of the migrations, so a schema change makes a new template), and
// every test gets a clone of it (CREATE DATABASE ... TEMPLATE), dropped when
// the test ends. Clones are independent, so tests using them can run in
// parallel, also across test binaries.
//
// The server comes from TOOLSVC_TEST_DATABASE_URL (a postgres:// URL whose
// user may create databases), by default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. If it cannot
// be reached, the test fails when the CI environment variable is set and is
// skipped otherwise — loudly, with the command that starts the local server.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/migrations"
)

// EnvURL names the environment variable with the test server's URL.
const EnvURL = "TOOLSVC_TEST_DATABASE_URL"

// DefaultURL is the test server when EnvURL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockKey serializes template builds across test binaries (session
// advisory lock in the server's maintenance database).
const templateLockKey int64 = 0x746f6f6c7376632b // "toolsvc+"

// opTimeout bounds each administrative step (connect, clone, drop, build).
const opTimeout = 2 * time.Minute

// URL returns the URL of the test server after checking that it answers. If
// it does not, it fails the test when CI is set and skips it otherwise, with
// a message that says how to start the server.
func URL(t testing.TB) string {
	t.Helper()
	u := serverURL()
	conn := connect(t, u)
	closeConn(conn)
	return u
}

// NewDatabase creates a database for this test, a clone of the migrated
// template, and returns its URL. The database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	u := serverURL()
	admin := connect(t, u)
	defer closeConn(admin)

	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tpl, err := templateName()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := ensureTemplate(ctx, admin, u, tpl); err != nil {
		t.Fatalf("pgtest: prepare template database %s: %v", tpl, err)
	}
	name := uniqueName(t)
	start := time.Now()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(tpl)); err != nil {
		t.Fatalf("pgtest: clone %s into %s: %v", tpl, name, err)
	}
	t.Logf("pgtest: database %s cloned from %s in %s", name, tpl, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { dropDatabase(t, u, name) })
	return withDatabase(t, u, name)
}

// NewEmptyDatabase creates an empty database (no migrations applied) for
// this test and returns its URL; it is dropped when the test ends. For
// tests of the migrations themselves.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	u := serverURL()
	admin := connect(t, u)
	defer closeConn(admin)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	name := uniqueName(t)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE template0"); err != nil {
		t.Fatalf("pgtest: create %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, u, name) })
	return withDatabase(t, u, name)
}

// NewStore opens a postgres.Store on a fresh database (NewDatabase). The
// store is closed, then the database dropped, when the test ends.
func NewStore(t testing.TB) *postgres.Store {
	t.Helper()
	dbURL := NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	s, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: open store: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// NewPool opens a pool on dbURL, closed when the test ends.
func NewPool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func serverURL() string {
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return DefaultURL
}

// connect opens an administrative connection to the server, or ends the
// test (fail under CI, skip otherwise) with instructions.
func connect(t testing.TB, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err == nil {
		return conn
	}
	shown := u
	if parsed, perr := url.Parse(u); perr == nil {
		shown = parsed.Redacted()
	}
	msg := fmt.Sprintf(`
==================================================================
pgtest: cannot reach the test Postgres server at %s:
    %v
Start the local server with:
    pg_ctlcluster --skip-systemctl-redirect 15 main start
or point %s at a server whose user may create databases.
==================================================================`, shown, err, EnvURL)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s\nCI is set: Postgres tests must run, failing.", msg)
	}
	t.Skipf("%s\nSKIPPING this Postgres test (set CI=1 to make this a failure).", msg)
	return nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// templateName derives the template's name from the embedded migrations.
func templateName() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return "toolsvc_tpl_" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ensureTemplate creates and migrates the template unless it exists. It is
// built under another name and renamed when complete, so its existence
// means it is ready; the advisory lock makes concurrent test binaries wait
// for one builder.
func ensureTemplate(ctx context.Context, admin *pgx.Conn, u, tpl string) error {
	ready := func() (bool, error) {
		var ok bool
		err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", tpl).Scan(&ok)
		return ok, err
	}
	if ok, err := ready(); err != nil || ok {
		return err
	}
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = admin.Exec(uctx, "SELECT pg_advisory_unlock($1)", templateLockKey)
	}()
	if ok, err := ready(); err != nil || ok {
		return err
	}
	building := tpl + "_build"
	// A builder that died left this behind.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(building)+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(building)+" TEMPLATE template0"); err != nil {
		return err
	}
	if err := migrateDatabase(ctx, u, building); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident(building)+" RENAME TO "+ident(tpl)); err != nil {
		return err
	}
	// Nobody may connect to the template: a session on it would make every
	// clone fail ("source database is being accessed by other users").
	_, err := admin.Exec(ctx, "ALTER DATABASE "+ident(tpl)+" WITH ALLOW_CONNECTIONS false")
	return err
}

func migrateDatabase(ctx context.Context, u, name string) error {
	dbURL, err := replaceDatabase(u, name)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

func dropDatabase(t testing.TB, u, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Errorf("pgtest: drop %s: %v", name, err)
		return
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
		t.Errorf("pgtest: drop %s: %v", name, err)
	}
}

// uniqueName returns a fresh database name.
func uniqueName(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("pgtest: random name: %v", err)
	}
	return "toolsvc_test_" + hex.EncodeToString(b[:])
}

func withDatabase(t testing.TB, u, name string) string {
	dbURL, err := replaceDatabase(u, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dbURL
}

// replaceDatabase returns the server URL u pointing at database name.
func replaceDatabase(u, name string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "postgres" && parsed.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvURL)
	}
	parsed.Path = "/" + name
	parsed.RawPath = ""
	return parsed.String(), nil
}

// ident quotes a database name as an SQL identifier.
func ident(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// Admin runs sql on the test server's maintenance database (for tests that
// need to act on the server, such as killing a backend).
func Admin(t testing.TB, sql string, args ...any) {
	t.Helper()
	conn := connect(t, serverURL())
	defer closeConn(conn)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", strings.SplitN(sql, " ", 2)[0], err)
	}
}
