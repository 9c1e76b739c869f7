package postgres

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// audit_events is partitioned by range of time (migration 0011): one
// partition per UTC day, named auditPartitionPrefix + YYYYMMDD, and a
// default partition for every event that no day partition takes. The store
// creates the day partitions ahead of time (MaintainAuditPartitions), and
// retention drops whole day partitions (DeleteAuditEventsBefore).
const (
	auditPartitionPrefix = "audit_events_p"
	auditDefaultPart     = "audit_events_default"
	// auditPartitionsAhead is how many days after today have a partition
	// ready: the maintenance runs every auditMaintainEvery, so a day's
	// partition exists long before its first event.
	auditPartitionsAhead = 2
	auditMaintainEvery   = time.Hour
	// partitionLockTimeout bounds how long dropping a partition waits for
	// its lock on audit_events, during which appends queue behind it: a
	// drop that cannot have the lock at once is tried again next round
	// rather than stall the hot path.
	partitionLockTimeout = "100ms"
)

// auditPartitionName is the name of the partition of the UTC day of t.
func auditPartitionName(t time.Time) string {
	return auditPartitionPrefix + t.UTC().Format("20060102")
}

// utcDay is the start of the UTC day of t.
func utcDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// sqlTime is t as an SQL timestamptz literal (RFC 3339, which Postgres
// reads whatever the session's time zone).
func sqlTime(t time.Time) string {
	return "'" + t.UTC().Format(time.RFC3339) + "'"
}

// MaintainAuditPartitions makes sure audit_events has a partition for the
// UTC day of now and each of the auditPartitionsAhead days after it, and
// returns how many it created. It runs in one transaction under the
// migration lock (a transaction-level advisory lock on the same key), so
// that replicas and migrations take turns; it waits for the lock. On a
// database whose audit_events is not partitioned (before migration 0011)
// it does nothing.
//
// Events of a day whose partition is missing are in the default partition;
// creating the partition moves them into it (the partition is built as a
// table of its own, the rows moved, and then attached, so that the
// notification trigger does not fire again for the moved rows).
func (s *Store) MaintainAuditPartitions(ctx context.Context, now time.Time) (int, error) {
	// A connection of its own, not one of the pool's: the pool's
	// connections stay those of the hot path (each prepares its statements
	// once), and a maintenance round neither waits for one nor adds one.
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return 0, fmt.Errorf("maintain audit partitions: %w", interpretError(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	created := 0
	err = s.retry(ctx, func() error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return maintainAuditPartitions(ctx, tx, now, &created) })
	})
	if err != nil {
		return 0, fmt.Errorf("maintain audit partitions: %w", interpretError(err))
	}
	return created, nil
}

// maintainAuditPartitions is MaintainAuditPartitions' transaction.
func maintainAuditPartitions(ctx context.Context, tx pgx.Tx, now time.Time, created *int) error {
	*created = 0
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey); err != nil {
		return interpretError(err)
	}
	var partitioned bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class
			WHERE oid = to_regclass('audit_events') AND relkind = 'p')`).Scan(&partitioned); err != nil {
		return interpretError(err)
	}
	if !partitioned {
		return nil
	}
	have, err := auditPartitions(ctx, tx)
	if err != nil {
		return err
	}
	for i := 0; i <= auditPartitionsAhead; i++ {
		from := utcDay(now).AddDate(0, 0, i)
		name := auditPartitionName(from)
		if _, ok := have[name]; ok {
			continue
		}
		if err := createAuditPartition(ctx, tx, name, from, from.AddDate(0, 0, 1)); err != nil {
			return err
		}
		*created++
	}
	return nil
}

// createAuditPartition creates the partition name for [from, to), moving
// into it the default partition's events of that range.
func createAuditPartition(ctx context.Context, tx pgx.Tx, name string, from, to time.Time) error {
	const cols = `seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
		risk, decision, outcome, detail`
	stmts := []string{
		`CREATE TABLE ` + name + ` (LIKE audit_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		`WITH moved AS (DELETE FROM ` + auditDefaultPart + ` WHERE time >= ` + sqlTime(from) + ` AND time < ` + sqlTime(to) +
			` RETURNING ` + cols + `) INSERT INTO ` + name + ` (` + cols + `) SELECT ` + cols + ` FROM moved`,
		`ALTER TABLE audit_events ATTACH PARTITION ` + name + ` FOR VALUES FROM (` + sqlTime(from) + `) TO (` + sqlTime(to) + `)`,
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("create partition %s: %w", name, interpretError(err))
		}
	}
	return nil
}

// auditPartitions returns the day partitions of audit_events by name, with
// the day each holds.
func auditPartitions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[string]time.Time, error) {
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'audit_events'::regclass`)
	if err != nil {
		return nil, interpretError(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, interpretError(err)
	}
	out := make(map[string]time.Time, len(names))
	for _, n := range names {
		day, ok := strings.CutPrefix(n, auditPartitionPrefix)
		if !ok {
			continue
		}
		t, err := time.Parse("20060102", day)
		if err != nil {
			continue
		}
		out[n] = t
	}
	return out, nil
}

// dropAuditPartitions drops the day partitions that end at or before
// before, oldest first, and returns how many events they held (as the
// database's statistics estimate them, for an analyzed partition:
// partitionEvents). A partition whose lock cannot be had within
// partitionLockTimeout is left for the next round. The number is taken
// before the drop, without blocking appends; an event appended to the
// dropped day in between (an append with a time already past retention) is
// dropped uncounted.
func (s *Store) dropAuditPartitions(ctx context.Context, before time.Time) (int, error) {
	var have map[string]time.Time
	err := s.retry(ctx, func() error {
		var partitioned bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class
				WHERE oid = to_regclass('audit_events') AND relkind = 'p')`).Scan(&partitioned); err != nil {
			return interpretError(err)
		}
		if !partitioned {
			return nil
		}
		var err error
		have, err = auditPartitions(ctx, s.pool)
		return err
	})
	if err != nil {
		return 0, err
	}
	var names []string
	for n, day := range have {
		if !day.AddDate(0, 0, 1).After(before) {
			names = append(names, n)
		}
	}
	sort.Strings(names) // by day
	total := 0
	for _, name := range names {
		n, err := partitionEvents(ctx, s.pool, name)
		if err != nil {
			if isUndefinedTable(err) { // dropped meanwhile by another replica
				continue
			}
			return total, interpretError(err)
		}
		// Emptied first, then dropped: the drop locks the whole trail
		// (ACCESS EXCLUSIVE on audit_events, which every append waits
		// for) until it commits, and the commit that removes a day's
		// files takes ≈ 0.1 s per million events. TRUNCATE removes them
		// under a lock of the day's partition only, which nothing appends
		// to; the drop of the empty partition then holds the trail's lock
		// for a few milliseconds.
		for i, stmt := range []string{`TRUNCATE `, `DROP TABLE IF EXISTS `} {
			err = s.tryTx(ctx, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+partitionLockTimeout+`'`); err != nil {
					return interpretError(err)
				}
				_, err := tx.Exec(ctx, stmt+name)
				return err
			})
			if err != nil {
				break
			}
			if i == 0 {
				total += int(n) // removed, whether the drop follows now or at the next round
			}
		}
		if isUndefinedTable(err) { // dropped meanwhile by another replica
			continue
		}
		switch {
		case err == nil:
		case isLockTimeout(err):
			return total, nil
		default:
			return total, fmt.Errorf("drop partition %s: %w", name, interpretError(err))
		}
	}
	return total, nil
}

// partitionEvents is how many events the partition name holds: the
// database's estimate once the partition has been analyzed (autovacuum
// analyzes a day's partition as it fills, each time a tenth more has
// been written, so the estimate of a past day is within about a tenth),
// else a count. Counting a past
// day of millions of events would read all of them, on the database's CPU,
// while calls go on: a day is dropped in milliseconds, its count took
// seconds.
func partitionEvents(ctx context.Context, q querier, name string) (int64, error) {
	var est *int64
	if err := q.QueryRow(ctx, `SELECT CASE WHEN c.reltuples >= 0 AND coalesce(s.last_analyze, s.last_autoanalyze) IS NOT NULL
			THEN c.reltuples::bigint END
		FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE c.oid = to_regclass($1)`, name).Scan(&est); err != nil {
		if errors.Is(err, pgx.ErrNoRows) { // gone
			return 0, &pgconn.PgError{Code: "42P01", Message: "relation " + name + " does not exist"}
		}
		return 0, err
	}
	if est != nil {
		return *est, nil
	}
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM `+name).Scan(&n)
	return n, err
}

func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// maintainAuditPartitions runs MaintainAuditPartitions now and every
// auditMaintainEvery until ctx ends. A failed round is tried again at the
// next: until then new events go to the default partition, so nothing on
// the hot path depends on it.
func (s *Store) maintainAuditPartitions(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, _ = s.MaintainAuditPartitions(ctx, time.Now())
		t.Reset(auditMaintainEvery)
	}
}
