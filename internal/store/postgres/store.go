// Package postgres is toolsvc's production store: store.Store on Postgres
// through pgx/v5, the embedded schema migrations and their runner, and
// cross-replica change notifications over LISTEN/NOTIFY.
//
// Every method is one transaction (or one statement); the audit events,
// task history and notifications a change produces ride in the same
// transaction as the change. Round trips cost more than commits (see
// BENCHMARKS.md), so the hot path spends as few as it can: a claim
// (ClaimCall), a recorded outcome without a health change (FinishCall) and
// an audit append (AppendAuditEvents) are each one statement —
// data-modifying CTEs write the events, history and notifications only if
// the change matched — and concurrent ones share a round trip and a commit
// (group commit, see committer); a parked call is started by one pipelined
// batch (BEGIN, statement, events) and its COMMIT. Elsewhere the statements
// that ride along are batched into one round trip inside the transaction.
// Concurrency is left to Postgres: claims are single INSERT ... ON CONFLICT
// statements, parked calls are started by one data-modifying statement,
// health changes lock their row, and reapers use FOR UPDATE SKIP LOCKED so
// that replicas share the work instead of colliding.
package postgres

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/store"
)

// notifyChannel is the LISTEN/NOTIFY channel. Payloads are "<topic>:<key>".
const notifyChannel = "toolsvc_changes"

// maxTxAttempts bounds how often a transaction aborted by Postgres to break a
// deadlock or serialization conflict is run again.
const maxTxAttempts = 4

// rollbackTimeout bounds a rollback, which runs even if the caller's context
// has ended (the connection must go back to the pool clean).
const rollbackTimeout = 5 * time.Second

// Store is store.Store on Postgres. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	group *committer

	closeOnce sync.Once
	listener  *listener
	// stopMaintain ends the audit partition maintenance; maintained is
	// closed when it has.
	stopMaintain context.CancelFunc
	maintained   chan struct{}
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at databaseURL (a postgres:// URL or a
// key=value connection string) and checks that it answers; the Store keeps
// audit_events' day partitions created ahead until it is closed. A malformed URL
// gives an error wrapping store.ErrInvalid; a server that cannot be reached
// one wrapping store.ErrUnavailable. The caller owns the Store and closes it.
// Open does not check the schema version: see CheckSchema.
func Open(ctx context.Context, databaseURL string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx redacts the password in its parse errors.
		return nil, fmt.Errorf("%w: parse database URL: %s", store.ErrInvalid, err.Error())
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "toolsvc"
	}
	// Plans that stay on the indexes whatever the statistics: pgx prepares
	// each statement once per connection, and Postgres may keep the generic
	// plan it made while a table was small (or analyzed while empty) — a
	// sequential scan — after the table has grown. Every lookup the store
	// makes has an index; with sequential scans priced out, the planner
	// picks it for any table size. A URL may set the parameter itself.
	if _, ok := cfg.ConnConfig.RuntimeParams["enable_seqscan"]; !ok {
		cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	}
	if !poolSizeSet(databaseURL) {
		cfg.MaxConns = DefaultMaxConns()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", interpretError(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database %s:%d/%s: %w",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, interpretError(err))
	}
	s := New(pool)
	s.startMaintenance() //nolint:contextcheck // the upkeep outlives Open's context: it runs until Close
	return s, nil
}

// startMaintenance keeps audit_events' day partitions created ahead of
// time (MaintainAuditPartitions), now and every hour, until Close.
func (s *Store) startMaintenance() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopMaintain, s.maintained = cancel, make(chan struct{})
	go func() {
		defer close(s.maintained)
		s.maintainAuditPartitions(ctx)
	}()
}

// DefaultMaxConns is the pool size when the database URL sets no
// pool_max_conns: 4 per CPU, at least 16. Concurrent calls share commits
// (group commit, see committer), and Postgres flushes the commits of
// concurrent transactions together, so throughput grows with the
// connections in use well past the CPUs: most of a connection's time is
// spent waiting for the disk, not computing.
func DefaultMaxConns() int32 {
	return int32(max(16, 4*runtime.NumCPU()))
}

// poolSizeSet reports whether a database URL (or key=value connection
// string) sets pool_max_conns.
func poolSizeSet(databaseURL string) bool {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return false
	}
	_, ok := cfg.RuntimeParams["pool_max_conns"]
	return ok
}

// New returns a Store on pool. The Store takes ownership: Close closes the
// pool. Unlike Open, it starts nothing in the background.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool, group: newCommitter(pool)}
	s.listener = newListener(pool.Config().ConnConfig)
	return s
}

// Pool returns the Store's connection pool (for migrations and checks).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping reports whether the database answers (an error wrapping
// store.ErrUnavailable if not).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping database: %w", interpretError(err))
	}
	return nil
}

// Close stops the audit partition maintenance and the notification
// listener, closes every subscription channel and closes the pool. It is
// safe to call more than once.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		if s.stopMaintain != nil {
			s.stopMaintain()
			<-s.maintained
		}
		s.listener.close()
		s.pool.Close()
	})
}

// inTx runs fn in a transaction and commits it. fn's errors are returned as
// they are (fn interprets the driver errors it gets). A transaction Postgres
// aborted to resolve a deadlock or serialization conflict is run again, so
// fn must be repeatable: it may only change the caller's values once it can
// no longer fail, or in ways a rerun overwrites.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.retry(ctx, func() error { return s.tryTx(ctx, fn) })
}

// retry runs fn, and runs it again (maxTxAttempts times in all) while it
// fails because Postgres aborted its transaction to break a deadlock or a
// serialization conflict. fn runs a whole transaction — an explicit one, or
// one statement in autocommit — so it must be repeatable in the sense inTx
// describes.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !retryable(err) || attempt == maxTxAttempts || ctx.Err() != nil {
			return err
		}
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return interpretError(err)
	}
	defer rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return interpretError(err)
	}
	return nil
}

// rollback rolls tx back unless it was committed. It runs on a context that
// ignores the caller's cancellation (an abandoned request must still return
// its connection clean) but not for long.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	// After a commit this is a no-op (pgx.ErrTxClosed). A failed rollback
	// needs no handling here: pgx closes the connection, so the pool never
	// hands out a connection stuck in a transaction.
	_ = tx.Rollback(rctx)
}

// tail collects the statements that ride along with a change — audit
// events, a task history entry, notifications — and sends them in one batch
// (one round trip) inside the change's transaction.
type tail struct {
	batch pgx.Batch
	err   error
}

const insertAuditEventSQL = `INSERT INTO audit_events
	(id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action, risk, decision, outcome, detail)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
	RETURNING seq`

// events queues the events in order; each event's Seq is set when the batch
// runs. If an event is refused, none is queued.
func (t *tail) events(events []store.AuditEvent) {
	details, err := auditDetails(events)
	if err != nil {
		t.fail(err)
		return
	}
	for i := range events {
		ev := &events[i]
		var detail any
		if details[i] != nil {
			detail = *details[i]
		}
		t.batch.Queue(insertAuditEventSQL,
			ev.ID, ev.Time, ev.Type, ev.CallID, ev.TraceID, ev.TaskID, ev.StepID, ev.Principal,
			ev.Tool, ev.Action, riskText(ev.Risk), string(ev.Decision), string(ev.Outcome), detail,
		).QueryRow(func(row pgx.Row) error { return row.Scan(&ev.Seq) })
	}
}

// history queues a task history entry.
func (t *tail) history(h *store.TaskHistoryEntry) {
	if h == nil {
		return
	}
	if h.PrincipalID == "" || h.TaskID == "" {
		t.fail(fmt.Errorf("%w: task history entry needs a principal and a task", store.ErrInvalid))
		return
	}
	t.batch.Queue(`INSERT INTO task_history (principal_id, task_id, call_id, tool, action, resource, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		h.PrincipalID, h.TaskID, h.CallID, h.Tool, h.Action, h.Resource, h.At)
}

// notify queues a notification; Postgres delivers it when the transaction
// commits (and drops it if it rolls back).
func (t *tail) notify(topic store.Topic, key string) {
	t.batch.Queue("SELECT pg_notify($1, $2)", notifyChannel, string(topic)+":"+key)
}

func (t *tail) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// send runs the queued statements in tx.
func (t *tail) send(ctx context.Context, tx pgx.Tx) error {
	if t.err != nil {
		return t.err
	}
	if t.batch.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, &t.batch).Close(); err != nil {
		return interpretError(err)
	}
	return nil
}

// exists reports whether a row matches query (used to tell ErrNotFound from
// ErrConflict after a conditional update matched nothing).
func exists(ctx context.Context, q querier, query string, args ...any) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, "SELECT EXISTS ("+query+")", args...).Scan(&ok); err != nil {
		return false, interpretError(err)
	}
	return ok, nil
}

// notFoundOrConflict is the error of a conditional change that matched no
// row: ErrNotFound if the record does not exist, else ErrConflict.
func notFoundOrConflict(ctx context.Context, q querier, what, id, query string) error {
	ok, err := exists(ctx, q, query, id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s %q: %w", what, id, store.ErrNotFound)
	}
	return fmt.Errorf("%s %q is not in the required state: %w", what, id, store.ErrConflict)
}

// stmt assembles a statement from parts, its text and its arguments
// together, each part numbering its placeholders after the ones before it.
//
// A hot-path statement's text depends only on its shape — which parts it
// has — never on its values (a batch of events is a set of arrays, one
// placeholder each), so it is written once per shape and kept (stmtTexts):
// after that, a statement of the same shape gathers only its arguments, and
// writes no text at all. The builders write text only through sql and arg,
// and choose parts only by the shape they are keyed by.
type stmt struct {
	args []any
	b    *strings.Builder // nil when the text is already known
}

// newStmt starts a statement of the shape key in texts with args as its
// first arguments; text is its text if known ("" if it must be written).
func newStmt(texts *sync.Map, key any, args ...any) (s *stmt, text string) {
	s = &stmt{args: args}
	if t, ok := texts.Load(key); ok {
		return s, t.(string)
	}
	s.b = new(strings.Builder)
	return s, ""
}

// finish returns the statement's text, keeping a newly written one in
// texts under key.
func (s *stmt) finish(texts *sync.Map, key any, text string) string {
	if s.b == nil {
		return text
	}
	t, _ := texts.LoadOrStore(key, s.b.String())
	return t.(string)
}

// arg appends v to the arguments and returns its placeholder ("" when no
// text is written).
func (s *stmt) arg(v any) string {
	s.args = append(s.args, v)
	if s.b == nil {
		return ""
	}
	return "$" + strconv.Itoa(len(s.args))
}

// sql writes parts of the text (nothing when the text is known).
func (s *stmt) sql(parts ...string) {
	if s.b == nil {
		return
	}
	for _, p := range parts {
		s.b.WriteString(p)
	}
}

// querier is what pgx.Tx, *pgxpool.Pool and *pgx.Conn have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
