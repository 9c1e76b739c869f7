package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/migrations"
)

// Schema check errors, returned (wrapped) by CheckSchema.
var (
	// ErrSchemaBehind: the database lacks migrations this binary needs.
	ErrSchemaBehind = errors.New("database schema is behind")
	// ErrSchemaAhead: the database has migrations this binary does not know
	// (a newer toolsvc migrated it).
	ErrSchemaAhead = errors.New("database schema is ahead")
)

// migrationLockKey is the pg_advisory_lock key that serializes migrators: the
// first 8 bytes of "toolsvc:" as a big-endian integer, so that it does not
// collide with another application's small integer keys on a shared server.
const migrationLockKey int64 = 0x746f6f6c7376633a

// migrationsTable records applied migrations. It is created by the runner,
// not by a migration, so that the first migration is recorded like any other.
const migrationsTable = "toolsvc_schema_migrations"

// MigrationStatus describes one migration: known to this binary, applied in
// the database, or both.
type MigrationStatus struct {
	Version int
	Name    string
	// Applied reports whether the database has it; AppliedAt is when.
	Applied   bool
	AppliedAt time.Time
	// Unknown: applied in the database but not among this binary's
	// migrations (a newer toolsvc applied it).
	Unknown bool
}

// migration is one embedded migration.
type migration struct {
	version int
	name    string
	up      string
	down    string
}

var migrationFileRE = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// loadMigrations reads and checks the embedded migrations, in version order.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*migration{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m := migrationFileRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		version, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &migration{version: version, name: m[2]}
			byVersion[version] = mig
		}
		if mig.name != m[2] {
			return nil, fmt.Errorf("migration %04d has two names: %q and %q", version, mig.name, m[2])
		}
		if m[3] == "up" {
			mig.up = string(body)
		} else {
			mig.down = string(body)
		}
	}
	out := make([]migration, 0, len(byVersion))
	for _, mig := range byVersion {
		if mig.version == 0 {
			return nil, errors.New("migration version 0000 is reserved for the empty schema")
		}
		if mig.up == "" || mig.down == "" {
			return nil, fmt.Errorf("migration %04d_%s needs both an .up.sql and a .down.sql file", mig.version, mig.name)
		}
		out = append(out, *mig)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// knownMigrations returns the migrations embedded in this binary.
func knownMigrations() ([]migration, error) { return loadMigrations(migrations.FS) }

// LatestMigration returns the version of the newest migration embedded in
// this binary (the schema version it needs).
func LatestMigration() (int, error) {
	known, err := knownMigrations()
	if err != nil {
		return 0, err
	}
	if len(known) == 0 {
		return 0, nil
	}
	return known[len(known)-1].version, nil
}

// Migrate applies every pending migration in version order, each in its own
// transaction, and returns the ones it applied. It holds a session advisory
// lock throughout, so replicas migrating at the same time apply each
// migration once: the later ones wait and find nothing left to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	known, err := knownMigrations()
	if err != nil {
		return nil, err
	}
	var done []MigrationStatus
	err = withMigrationLock(ctx, pool, func(conn *pgx.Conn) error {
		applied, err := appliedMigrations(ctx, conn)
		if err != nil {
			return err
		}
		for _, mig := range known {
			if _, ok := applied[mig.version]; ok {
				continue
			}
			at, err := applyMigration(ctx, conn, mig.version, mig.name, mig.up, true)
			if err != nil {
				return err
			}
			done = append(done, MigrationStatus{Version: mig.version, Name: mig.name, Applied: true, AppliedAt: at})
		}
		return nil
	})
	return done, err
}

// MigrateDown reverts the newest steps applied migrations, newest first, each
// in its own transaction, under the same lock as Migrate. It returns the ones
// it reverted (Applied false). It refuses, changing nothing, to revert a
// migration this binary does not know.
func MigrateDown(ctx context.Context, pool *pgxpool.Pool, steps int) ([]MigrationStatus, error) {
	if steps < 0 {
		return nil, fmt.Errorf("%w: migrate down by %d steps", store.ErrInvalid, steps)
	}
	known, err := knownMigrations()
	if err != nil {
		return nil, err
	}
	byVersion := map[int]migration{}
	for _, m := range known {
		byVersion[m.version] = m
	}
	var done []MigrationStatus
	err = withMigrationLock(ctx, pool, func(conn *pgx.Conn) error {
		applied, err := appliedMigrations(ctx, conn)
		if err != nil {
			return err
		}
		versions := make([]int, 0, len(applied))
		for v := range applied {
			versions = append(versions, v)
		}
		sort.Sort(sort.Reverse(sort.IntSlice(versions)))
		versions = versions[:min(steps, len(versions))]
		for _, v := range versions {
			if _, ok := byVersion[v]; !ok {
				return fmt.Errorf("%w: migration %04d is applied but unknown to this toolsvc; revert it with the toolsvc that applied it", ErrSchemaAhead, v)
			}
		}
		for _, v := range versions {
			mig := byVersion[v]
			if _, err := applyMigration(ctx, conn, mig.version, mig.name, mig.down, false); err != nil {
				return err
			}
			done = append(done, MigrationStatus{Version: mig.version, Name: mig.name})
		}
		return nil
	})
	return done, err
}

// Status lists every migration this binary knows, applied or not, followed by
// those applied in the database that it does not know, in version order.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	known, err := knownMigrations()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", interpretError(err))
	}
	defer conn.Release()
	applied, err := appliedMigrations(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	out := make([]MigrationStatus, 0, len(known))
	for _, m := range known {
		st := MigrationStatus{Version: m.version, Name: m.name}
		if a, ok := applied[m.version]; ok {
			st.Applied, st.AppliedAt = true, a.AppliedAt
			delete(applied, m.version)
		}
		out = append(out, st)
	}
	for _, a := range applied {
		out = append(out, a)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// CheckSchema returns nil if the database is exactly at this binary's
// migrations, an error wrapping ErrSchemaBehind if migrations are missing, or
// one wrapping ErrSchemaAhead if the database has migrations this binary does
// not know. A server that cannot be reached gives store.ErrUnavailable.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	statuses, err := Status(ctx, pool)
	if err != nil {
		return err
	}
	latest, err := LatestMigration()
	if err != nil {
		return err
	}
	dbVersion, missing, unknown := 0, 0, []int(nil)
	for _, st := range statuses {
		switch {
		case st.Unknown:
			unknown = append(unknown, st.Version)
			dbVersion = max(dbVersion, st.Version)
		case st.Applied:
			dbVersion = max(dbVersion, st.Version)
		default:
			missing++
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("%w: database schema is at version %d, this toolsvc knows only up to %d (unknown migrations %v): upgrade toolsvc",
			ErrSchemaAhead, dbVersion, latest, unknown)
	}
	if missing > 0 {
		return fmt.Errorf("%w: database schema is at version %d, this toolsvc needs %d (%d migration(s) pending): run `toolsvc migrate up` or start with --migrate",
			ErrSchemaBehind, dbVersion, latest, missing)
	}
	return nil
}

// withMigrationLock runs fn on one connection holding the migration advisory
// lock, after making sure the migrations table exists.
func withMigrationLock(ctx context.Context, pool *pgxpool.Pool, fn func(*pgx.Conn) error) error {
	pconn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", interpretError(err))
	}
	conn := pconn.Conn()
	// pg_advisory_lock waits for the holder; pgx cancels the wait if ctx ends.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockKey); err != nil {
		pconn.Release()
		return fmt.Errorf("migrate: take the migration lock: %w", interpretError(err))
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", migrationLockKey); err != nil {
			// A session lock lives as long as its connection: closing the
			// connection is the sure way to release it.
			_ = conn.Close(uctx)
		}
		pconn.Release()
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+migrationsTable+` (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("migrate: create %s: %w", migrationsTable, interpretError(err))
	}
	return fn(conn)
}

// appliedMigrations reads the migrations table; a missing table means none.
func appliedMigrations(ctx context.Context, conn *pgx.Conn) (map[int]MigrationStatus, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", migrationsTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", interpretError(err))
	}
	out := map[int]MigrationStatus{}
	if !exists {
		return out, nil
	}
	rows, err := conn.Query(ctx, "SELECT version, name, applied_at FROM "+migrationsTable+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", interpretError(err))
	}
	defer rows.Close()
	for rows.Next() {
		var st MigrationStatus
		if err := rows.Scan(&st.Version, &st.Name, &st.AppliedAt); err != nil {
			return nil, fmt.Errorf("read applied migrations: %w", interpretError(err))
		}
		st.Applied, st.Unknown = true, true // Status clears Unknown for known ones
		st.AppliedAt = st.AppliedAt.UTC()
		out[st.Version] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", interpretError(err))
	}
	return out, nil
}

// applyMigration runs one migration's SQL and records (up) or forgets (down)
// it, in one transaction. The SQL goes through the simple protocol, which
// allows several statements in one string.
func applyMigration(ctx context.Context, conn *pgx.Conn, version int, name, sql string, up bool) (time.Time, error) {
	dir := "down"
	if up {
		dir = "up"
	}
	fail := func(err error) (time.Time, error) {
		return time.Time{}, fmt.Errorf("migration %04d_%s (%s): %w", version, name, dir, interpretError(err))
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fail(err)
	}
	var at time.Time
	if up {
		err = tx.QueryRow(ctx, "INSERT INTO "+migrationsTable+" (version, name) VALUES ($1, $2) RETURNING applied_at",
			version, name).Scan(&at)
	} else {
		_, err = tx.Exec(ctx, "DELETE FROM "+migrationsTable+" WHERE version = $1", version)
	}
	if err != nil {
		return fail(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return at.UTC(), nil
}
